package round_test

import (
	"crypto/ed25519"
	"errors"
	"math"
	"testing"

	"github.com/fleetlearn/fleetlearn/aggregator"
	"github.com/fleetlearn/fleetlearn/privacy/secagg"
	"github.com/fleetlearn/fleetlearn/round"
)

// TestCheckForm: which payload a plaintext round takes for each of the
// task's encodings (server TestQuantizedPoisonRefused, TestBadReportsAreRefused).
func TestCheckForm(t *testing.T) {
	for _, c := range []struct {
		name string
		bits int
		form round.Form
		want string
	}{
		{"float32 task, float32 update", 0, round.FormDense, ""},
		{"int8 task, quantized update", 8, round.FormQuantized, ""},
		{"int4 task, quantized update", 4, round.FormQuantized, ""},
		{"int8 task, float32 update", 8, round.FormDense, "update is float32, task t takes int8 updates"},
		{"float32 task, quantized update", 0, round.FormQuantized, "update is quantized, task t takes float32 updates"},
		{"unknown width", 3, round.FormQuantized, "update encoding 3-bit is unknown"},
		{"masked update in a plaintext round", 0, round.FormMasked, "a masked one, but round 7 is not secure"},
		{"no payload", 0, round.FormNone, "no dense payload"},
	} {
		want := round.ClassPayload
		if c.want == "" {
			want = ""
		}
		refusedAs(t, c.name, round.CheckForm("t", 7, c.bits, c.form), want, c.want)
	}
	refusedAs(t, "int4 codes to an int8 task", round.CheckQuantized("t", 8, 4), round.ClassPayload, "update is int4-quantized, task t takes int8 updates")
	refusedAs(t, "int8 codes to an int8 task", round.CheckQuantized("t", 8, 8), "", "")
}

func TestEncodingNames(t *testing.T) {
	for _, name := range round.EncodingNames() {
		bits, ok := round.ParseEncoding(name)
		if !ok || round.EncodingName(bits) != name {
			t.Errorf("%s: parses to %d bits, named %s", name, bits, round.EncodingName(bits))
		}
	}
	if _, ok := round.ParseEncoding("int2"); ok {
		t.Error("int2 parsed")
	}
	if round.EncodingNames()[0] != "none" {
		t.Error("float32 is not listed first")
	}
}

// TestCheckDigest: the payload must hash to what the device signed (server
// TestBadReportsAreRefused: a payload altered after signing).
func TestCheckDigest(t *testing.T) {
	refusedAs(t, "same", round.CheckDigest("ab", "ab"), "", "")
	refusedAs(t, "altered", round.CheckDigest("ab", "cd"), round.ClassPayload, `payload sha256 ab does not match the declared "cd"`)
}

// TestCheckLayout: an update touches exactly the trained tensors (server
// TestLoRAReportsTouchOnlyAdapters: a device updating a frozen base weight).
func TestCheckLayout(t *testing.T) {
	want := []round.Tensor{{Name: "fc.lora_a", Shape: []uint64{4, 8}}, {Name: "fc.lora_b", Shape: []uint64{8, 4}}}
	for _, c := range []struct {
		name string
		got  []round.Tensor
		msg  string
	}{
		{"the adapters", want, ""},
		{"a frozen weight too", append(want[:2:2], round.Tensor{Name: "fc.weight", Shape: []uint64{8, 8}}), "update has 3 tensors, the task trains 2"},
		{"a frozen weight instead", []round.Tensor{want[0], {Name: "fc.weight", Shape: []uint64{8, 4}}}, "tensor 1 is fc.weight[8 4], the task trains fc.lora_b[8 4]"},
		{"reshaped", []round.Tensor{want[0], {Name: "fc.lora_b", Shape: []uint64{4, 8}}}, "tensor fc.lora_b has shape [4 8], model has [8 4]"},
		{"another rank", []round.Tensor{want[0], {Name: "fc.lora_b", Shape: []uint64{32}}}, "tensor 1 is fc.lora_b[32]"},
		{"swapped", []round.Tensor{want[1], want[0]}, "tensor 0 is fc.lora_b"},
		{"nothing", nil, "update has 0 tensors"},
	} {
		class := round.ClassPayload
		if c.msg == "" {
			class = ""
		}
		refusedAs(t, c.name, round.CheckLayout(want, c.got), class, c.msg)
	}
}

// TestCheckSignature: a report is signed by the key its device enrolled
// (server TestHostileMetric and TestHostileEvaluationRounds: metrics
// altered after signing; TestBadReportsAreRefused: unsigned reports).
func TestCheckSignature(t *testing.T) {
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	statement := []byte("task t round 7 device d payload ab examples 10")
	verify := func(signed []byte) func(ed25519.PublicKey, []byte) error {
		return func(k ed25519.PublicKey, sig []byte) error {
			if !ed25519.Verify(k, signed, sig) {
				return errors.New("ed25519: invalid signature")
			}
			return nil
		}
	}
	good := ed25519.Sign(priv, statement)
	s := round.Signed{Device: "d", KeyID: "k1", Sig: good, Key: pub}
	refusedAs(t, "signed", round.CheckSignature(s, verify(statement)), "", "")
	refusedAs(t, "statement altered after signing", round.CheckSignature(s, verify([]byte("task t round 7 device d payload ab examples 99"))),
		round.ClassSignature, `signature does not verify with the key device "d" enrolled (report names key "k1")`)
	unsigned := s
	unsigned.Sig = nil
	refusedAs(t, "unsigned", round.CheckSignature(unsigned, verify(statement)), round.ClassSignature, "report is not signed")
	open := round.Signed{Device: "d"}
	refusedAs(t, "not enrolled, open deployment", round.CheckSignature(open, verify(statement)), "", "")
	open.RequireEnrollment = true
	refusedAs(t, "not enrolled, enrollment required", round.CheckSignature(open, verify(statement)), round.ClassSignature, `device "d" is not enrolled`)
}

// TestCheckNorm: the task's norm bound, with the tolerance of norms summed
// in another order (server TestHostilePoisonDefaultBound,
// TestPoisonedUpdateRefusedByDefaultBound).
func TestCheckNorm(t *testing.T) {
	for _, c := range []struct {
		name        string
		norm, bound float64
		refused     bool
	}{
		{"within", 9.99, 10, false},
		{"at the bound", 10, 10, false},
		{"rounding above it", 10 * (1 + aggregator.NormTolerance/2), 10, false},
		{"poisoned", 1e6, 10, true},
		{"just past the tolerance", 10 * (1 + 2*aggregator.NormTolerance), 10, true},
		{"NaN", math.NaN(), 10, true},
		{"no bound", 1e30, 0, false},
	} {
		if c.refused {
			refusedAs(t, c.name, round.CheckNorm(c.norm, c.bound), round.ClassAggregate, "exceeds bound 10")
		} else {
			refusedAs(t, c.name, round.CheckNorm(c.norm, c.bound), "", "")
		}
	}
}

// TestCheckMasked: what a secure round takes of a masked report before its
// values (server TestSecureRounds' hostile participants, secagg's bad-input
// tests for the values themselves).
func TestCheckMasked(t *testing.T) {
	seat := round.Seat{Participant: 3, Examples: 50}
	ok := round.Masked{Present: true, Participant: 3, Bits: 20}
	for _, c := range []struct {
		name   string
		change func(*round.Masked)
		want   string
	}{
		{"as it must be", func(*round.Masked) {}, ""},
		{"plaintext update", func(m *round.Masked) { m.Present = false }, "masked updates only"},
		{"plaintext weight", func(m *round.Masked) { m.Examples = 50 }, "num_examples must be 0"},
		{"plaintext metrics", func(m *round.Masked) { m.Metrics = 1 }, "no plaintext metrics"},
		{"another participant's id", func(m *round.Masked) { m.Participant = 4 }, "masked update for participant 4 from participant 3"},
		{"another ring", func(m *round.Masked) { m.Bits = 32 }, "32-bit ring, the round's ring has 20 bits"},
	} {
		m := ok
		c.change(&m)
		class := round.ClassSecAgg
		if c.want == "" {
			class = ""
		}
		refusedAs(t, c.name, round.CheckMasked(m, seat, 20), class, c.want)
	}
	refusedAs(t, "in its stage", round.CheckMaskedStage(secagg.StageMaskedInput), "", "")
	refusedAs(t, "during key sharing", round.CheckMaskedStage(secagg.StageShareKeys), round.ClassSecAgg, "masked input arrived in the")
}
