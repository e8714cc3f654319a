package identity_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/fleetlearn/fleetlearn/identity"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
)

func statement() identity.ReportStatement {
	return identity.ReportStatement{Kind: identity.ReportUpdate, Task: "task1", Round: 7, Device: "dev-1",
		ModelVersion: "v3", ModuleSHA256: wire.SHA256([]byte("module")), PayloadSHA256: wire.SHA256([]byte("payload")), NumExamples: 600,
		MetricsSHA256: wire.MetricsSHA256(map[string]float64{"loss": 0.5})}
}

func TestReportSignatures(t *testing.T) {
	k, err := identity.GenerateUserKey(identity.WithRand(newDetRand("dev-1")))
	if err != nil {
		t.Fatal(err)
	}
	s := statement()
	sig, err := identity.SignReport(k.PrivateKey(), s)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := identity.ParseUserKeyID(k.ID())
	if err != nil {
		t.Fatal(err)
	}
	if err := identity.VerifyReport(pub, s, sig); err != nil {
		t.Fatal(err)
	}
	other, _ := identity.GenerateUserKey()
	// Every field is covered.
	for name, mut := range map[string]func(*identity.ReportStatement){
		"kind":     func(s *identity.ReportStatement) { s.Kind = identity.ReportEval },
		"task":     func(s *identity.ReportStatement) { s.Task = "task2" },
		"round":    func(s *identity.ReportStatement) { s.Round++ },
		"device":   func(s *identity.ReportStatement) { s.Device = "dev-2" },
		"model":    func(s *identity.ReportStatement) { s.ModelVersion = "v4" },
		"module":   func(s *identity.ReportStatement) { s.ModuleSHA256 = wire.SHA256([]byte("x")) },
		"payload":  func(s *identity.ReportStatement) { s.PayloadSHA256 = wire.SHA256([]byte("y")) },
		"examples": func(s *identity.ReportStatement) { s.NumExamples = 6000 },
		"metrics": func(s *identity.ReportStatement) {
			s.MetricsSHA256 = wire.MetricsSHA256(map[string]float64{"loss": 0.4})
		},
		"clip bit": func(s *identity.ReportStatement) { s.ClipBit = pb.ClipBit_CLIP_BIT_CLIPPED },
	} {
		m := statement()
		mut(&m)
		if err := identity.VerifyReport(pub, m, sig); !errors.Is(err, identity.ErrBadSignature) {
			t.Errorf("%s changed: %v", name, err)
		}
	}
	if err := identity.VerifyReport(other.PublicKey(), s, sig); !errors.Is(err, identity.ErrBadSignature) {
		t.Errorf("other key: %v", err)
	}
	if err := identity.VerifyReport(pub, s, sig[:10]); !errors.Is(err, identity.ErrBadSignature) {
		t.Errorf("short signature: %v", err)
	}
	if err := identity.VerifyReport(pub[:5], s, sig); !errors.Is(err, identity.ErrBadKey) {
		t.Errorf("short key: %v", err)
	}
	// A raw signature over the canonical bytes without the label fails: the
	// label is part of what is signed.
	b, _ := s.Bytes()
	if !bytes.Contains(b, []byte("fleetlearn/update-report/v2")) {
		t.Fatal("label missing")
	}
}

func TestReportStatementUnambiguous(t *testing.T) {
	// The two bits sign differently from each other and from no bit.
	var seen [][]byte
	for _, bit := range []pb.ClipBit{pb.ClipBit_CLIP_BIT_UNSPECIFIED, pb.ClipBit_CLIP_BIT_UNCLIPPED, pb.ClipBit_CLIP_BIT_CLIPPED} {
		s := statement()
		s.ClipBit = bit
		b, err := s.Bytes()
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range seen {
			if bytes.Equal(o, b) {
				t.Fatalf("clip bit %v encodes like another", bit)
			}
		}
		seen = append(seen, b)
	}
	a, b := statement(), statement()
	a.Task, a.Device = "ab", "c"
	b.Task, b.Device = "a", "bc"
	ba, _ := a.Bytes()
	bb, _ := b.Bytes()
	if bytes.Equal(ba, bb) {
		t.Fatal("different statements encode alike")
	}
}

func TestReportStatementBadInput(t *testing.T) {
	for name, mut := range map[string]func(*identity.ReportStatement){
		"kind":     func(s *identity.ReportStatement) { s.Kind = "x" },
		"task":     func(s *identity.ReportStatement) { s.Task = "a.b" },
		"device":   func(s *identity.ReportStatement) { s.Device = "" },
		"model":    func(s *identity.ReportStatement) { s.ModelVersion = "" },
		"long":     func(s *identity.ReportStatement) { s.ModelVersion = strings.Repeat("v", 257) },
		"module":   func(s *identity.ReportStatement) { s.ModuleSHA256 = "ABCD" },
		"payload":  func(s *identity.ReportStatement) { s.PayloadSHA256 = strings.ToUpper(wire.SHA256(nil)) },
		"clip bit": func(s *identity.ReportStatement) { s.ClipBit = 7 },
		"eval clip bit": func(s *identity.ReportStatement) {
			s.Kind, s.ClipBit = identity.ReportEval, pb.ClipBit_CLIP_BIT_UNCLIPPED
		},
	} {
		s := statement()
		mut(&s)
		if _, err := s.Bytes(); !errors.Is(err, identity.ErrBadInput) {
			t.Errorf("%s: %v", name, err)
		}
		if _, err := identity.SignReport(signingKey(t, "k"), s); !errors.Is(err, identity.ErrBadInput) {
			t.Errorf("sign %s: %v", name, err)
		}
	}
	if _, err := identity.SignReport(nil, statement()); !errors.Is(err, identity.ErrBadKey) {
		t.Errorf("nil key: %v", err)
	}
}
