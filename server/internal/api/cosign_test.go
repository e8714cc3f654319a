package api_test

import (
	"bytes"
	"crypto/rand"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetlearn/fleetlearn/audit"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/api"
)

// cosignEnv is the audit service over a log that accepts one witness.
type cosignEnv struct {
	lg      *audit.Log
	keys    audit.Keys
	witness audit.WitnessKey
	audit   apiv1.AuditServiceClient
	logs    *syncBuffer
	now     time.Time

	mu     sync.Mutex
	counts map[string]int
}

func newCosignEnv(t *testing.T) *cosignEnv {
	t.Helper()
	keys, err := audit.GenerateKeys(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	w, err := audit.GenerateWitnessKey(rand.Reader, "witness.example/w1")
	if err != nil {
		t.Fatal(err)
	}
	e := &cosignEnv{keys: keys, witness: w, logs: &syncBuffer{}, now: auditT0, counts: map[string]int{}}
	e.lg, err = audit.Open(t.Context(), t.TempDir(), audit.WithKeys(keys), audit.WithOrigin("test.fleetlearn/audit"),
		audit.WithClock(func() time.Time { return e.now }), audit.WithWitnesses(w.VerifierKey()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.lg.Close() })
	logger := slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	env := newEnv(t, api.WithAudit(e.lg), api.WithLogger(logger), api.WithCosignatureCounter(func(result string) {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.counts[result]++
	}))
	e.audit = apiv1.NewAuditServiceClient(env.conn)
	return e
}

func (e *cosignEnv) checkpoint(t *testing.T, n int) audit.Checkpoint {
	t.Helper()
	for range n {
		if _, err := e.lg.Record(t.Context(), audit.Operator("alice"), audit.TaskStopped{Task: "t-1", State: audit.TaskStoppedBy}); err != nil {
			t.Fatal(err)
		}
	}
	cp, err := e.lg.Checkpoint(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return cp
}

func TestAddCosignatureAndServe(t *testing.T) {
	ctx := t.Context()
	e := newCosignEnv(t)
	cp := e.checkpoint(t, 3)
	res, err := e.audit.GetCheckpoint(ctx, &pb.GetCheckpointRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(res.GetCheckpoint().GetNote(), cp.Note) || !bytes.Equal(res.GetCheckpoint().GetCosignedNote(), cp.Note) {
		t.Fatalf("before any cosignature: note %q, cosigned %q", res.GetCheckpoint().GetNote(), res.GetCheckpoint().GetCosignedNote())
	}
	at := e.now.Add(-30 * time.Second)
	cosigned, err := e.witness.Cosign(cp, at)
	if err != nil {
		t.Fatal(err)
	}
	added, err := e.audit.AddCosignature(ctx, &pb.AddCosignatureRequest{Note: cosigned})
	if err != nil {
		t.Fatal(err)
	}
	if added.GetWitness() != e.witness.VerifierKey() || added.GetTreeSize() != 3 || !added.GetTime().AsTime().Equal(at) {
		t.Fatalf("response %v", added)
	}
	res, err = e.audit.GetCheckpoint(ctx, &pb.GetCheckpointRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(res.GetCheckpoint().GetNote(), cp.Note) {
		t.Fatalf("the log-signed note changed: %q", res.GetCheckpoint().GetNote())
	}
	got, when, err := audit.VerifyCosignature(res.GetCheckpoint().GetCosignedNote(), e.lg.PublicKeys().VerifierKey, e.witness.VerifierKey())
	if err != nil || got.Size != 3 || !when.Equal(at) {
		t.Fatalf("served cosigned note: %v %v", when, err)
	}
	// A new checkpoint has no cosignature until the witness comes back.
	next := e.checkpoint(t, 1)
	res, err = e.audit.GetCheckpoint(ctx, &pb.GetCheckpointRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(res.GetCheckpoint().GetCosignedNote(), next.Note) {
		t.Fatalf("new checkpoint served with %q", res.GetCheckpoint().GetCosignedNote())
	}
	if !strings.Contains(e.logs.String(), "audit cosignature") {
		t.Fatalf("no debug log of the cosignature:\n%s", e.logs)
	}
}

func TestAddCosignatureRefusals(t *testing.T) {
	ctx := t.Context()
	e := newCosignEnv(t)
	older := e.checkpoint(t, 2)
	cp := e.checkpoint(t, 1)
	stranger, err := audit.GenerateWitnessKey(rand.Reader, "stranger.example/w")
	if err != nil {
		t.Fatal(err)
	}
	// A checkpoint signed with the log's key that this log never issued:
	// a copy of the log that went another way.
	fork, err := audit.Open(ctx, t.TempDir(), audit.WithKeys(e.keys), audit.WithOrigin("test.fleetlearn/audit"))
	if err != nil {
		t.Fatal(err)
	}
	defer fork.Close()
	if _, err := fork.Record(ctx, audit.Operator("mallory"), audit.TaskStopped{Task: "t-9", State: audit.TaskStoppedBy}); err != nil {
		t.Fatal(err)
	}
	forked, err := fork.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cosign := func(w audit.WitnessKey, cp audit.Checkpoint, at time.Time) []byte {
		b, err := w.Cosign(cp, at)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	good := cosign(e.witness, cp, e.now)
	before := e.lg.Size()
	for _, tc := range []struct {
		name   string
		note   []byte
		code   codes.Code
		says   string
		result string
	}{
		{"empty", nil, codes.InvalidArgument, "note is required", api.CosignatureInvalid},
		{"not a note", []byte("hello\n"), codes.InvalidArgument, "bad checkpoint", api.CosignatureInvalid},
		{"too large", append(bytes.Repeat([]byte("x"), audit.MaxNoteBytes), good...), codes.InvalidArgument, "longer than", api.CosignatureInvalid},
		{"unknown witness", cosign(stranger, cp, e.now), codes.PermissionDenied, "--audit-witness", api.CosignatureUnknownWitness},
		{"not cosigned", cp.Note, codes.PermissionDenied, "does not accept the witness", api.CosignatureUnknownWitness},
		{"never issued", cosign(e.witness, forked, e.now), codes.FailedPrecondition, "never issued", api.CosignatureNotIssued},
		// The witness's line over one checkpoint under another's text.
		{"bad cosignature", bytes.Replace(cosign(e.witness, older, e.now), older.Note, cp.Note, 1), codes.InvalidArgument, "bad cosignature", api.CosignatureInvalid},
		{"from the future", cosign(e.witness, cp, e.now.Add(time.Hour)), codes.InvalidArgument, "ahead of the log's clock", api.CosignatureInvalid},
	} {
		_, err := e.audit.AddCosignature(ctx, &pb.AddCosignatureRequest{Note: tc.note})
		if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.says) {
			t.Errorf("%s: %v, want %v saying %q", tc.name, err, tc.code, tc.says)
		}
	}
	if _, err := e.audit.AddCosignature(ctx, &pb.AddCosignatureRequest{Note: good}); err != nil {
		t.Fatal(err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	want := map[string]int{api.CosignatureInvalid: 5, api.CosignatureUnknownWitness: 2, api.CosignatureNotIssued: 1, api.CosignatureAccepted: 1}
	for k, v := range want {
		if e.counts[k] != v {
			t.Errorf("counted %d %s, want %d (all: %v)", e.counts[k], k, v, e.counts)
		}
	}
	// Cosignatures are not events.
	if e.lg.Size() != before {
		t.Fatalf("log grew from %d to %d", before, e.lg.Size())
	}
}
