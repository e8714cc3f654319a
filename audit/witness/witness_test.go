package witness_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/audit/witness"
	"github.com/fleetlearn/fleetlearn/internal/clock"
)

var t0 = time.Date(2026, 4, 1, 10, 0, 0, 0, time.UTC)

func seeded(seed byte) *mrand.ChaCha8 {
	var s [32]byte
	s[0] = seed
	return mrand.NewChaCha8(s)
}

// testLog is a log with fixed keys, so that a second one (a rolled-back or
// forked copy) signs with the same key.
type testLog struct {
	*audit.Log
}

func openLog(t *testing.T, keys audit.Keys) testLog {
	t.Helper()
	lg, err := audit.Open(t.Context(), t.TempDir(), audit.WithKeys(keys), audit.WithOrigin("test.fleetlearn/audit"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lg.Close() })
	return testLog{lg}
}

// grow appends n events naming tag and returns the new checkpoint.
func (l testLog) grow(t *testing.T, tag string, n int) audit.Checkpoint {
	t.Helper()
	for i := range n {
		if _, err := l.Record(t.Context(), audit.Operator("alice"), audit.TaskStopped{Task: fmt.Sprintf("%s-%d", tag, i), State: audit.TaskStoppedBy}); err != nil {
			t.Fatal(err)
		}
	}
	cp, err := l.Checkpoint(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return cp
}

func (l testLog) prove(ctx context.Context, size1, size2 uint64) ([][]byte, error) {
	return l.ConsistencyProof(ctx, size1, size2)
}

type env struct {
	keys  audit.Keys
	log   testLog
	vkey  string
	key   audit.WitnessKey
	dir   string
	clock *clock.Fake
}

func newEnv(t *testing.T) *env {
	t.Helper()
	keys, err := audit.GenerateKeys(seeded(1))
	if err != nil {
		t.Fatal(err)
	}
	key, err := audit.GenerateWitnessKey(seeded(2), "witness.example/w1")
	if err != nil {
		t.Fatal(err)
	}
	lg := openLog(t, keys)
	return &env{keys: keys, log: lg, vkey: lg.PublicKeys().VerifierKey, key: key, dir: t.TempDir(), clock: clock.NewFake(t0)}
}

func (e *env) witness(t *testing.T) *witness.Witness {
	t.Helper()
	w, err := witness.New(e.key, e.vkey, e.dir, witness.WithClock(e.clock))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

// cosigned checks a returned note and its cosignature time.
func (e *env) cosigned(t *testing.T, msg []byte, size uint64) time.Time {
	t.Helper()
	cp, at, err := audit.VerifyCosignature(msg, e.vkey, e.key.VerifierKey())
	if err != nil {
		t.Fatal(err)
	}
	if cp.Size != size {
		t.Fatalf("cosigned size %d, want %d", cp.Size, size)
	}
	return at
}

func evidence(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "conflict-*.txt"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestFollowsAGrowingLog(t *testing.T) {
	ctx := t.Context()
	e := newEnv(t)
	w := e.witness(t)
	if _, ok := w.Last(); ok {
		t.Fatal("a new witness has a state")
	}
	empty, err := e.log.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got, err := w.Update(ctx, empty.Note, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.cosigned(t, got, 0)
	proofs := 0
	prove := func(ctx context.Context, a, b uint64) ([][]byte, error) { proofs++; return e.log.prove(ctx, a, b) }
	for i, n := range []int{3, 1, 8} {
		cp := e.log.grow(t, fmt.Sprint(i), n)
		e.clock.Advance(10 * time.Second)
		got, err := w.Update(ctx, cp.Note, prove)
		if err != nil {
			t.Fatalf("size %d: %v", cp.Size, err)
		}
		if at := e.cosigned(t, got, cp.Size); !at.Equal(e.clock.Now().Truncate(time.Second)) {
			t.Fatalf("cosigned at %v, clock %v", at, e.clock.Now())
		}
		b, err := os.ReadFile(filepath.Join(e.dir, witness.CheckpointFile))
		if err != nil || !bytes.Equal(b, cp.Note) {
			t.Fatalf("state file %q, %v", b, err)
		}
	}
	// From the empty tree nothing needs proving; after it, each step does.
	if proofs != 2 {
		t.Fatalf("%d proofs fetched, want 2", proofs)
	}
	// An unchanged checkpoint is cosigned again, later.
	last, _ := w.Last()
	e.clock.Advance(time.Minute)
	got, err = w.Update(ctx, last.Note, func(context.Context, uint64, uint64) ([][]byte, error) {
		t.Fatal("proof asked for an unchanged checkpoint")
		return nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if at := e.cosigned(t, got, last.Size); !at.Equal(e.clock.Now()) {
		t.Fatalf("re-cosigned at %v, want %v", at, e.clock.Now())
	}
	if len(evidence(t, e.dir)) != 0 {
		t.Fatal("evidence written for a consistent log")
	}
}

// conflictCase grows the followed log and builds, from a log with the same
// keys, the checkpoint a misbehaving log would offer.
func TestRefusesInconsistentCheckpoints(t *testing.T) {
	for _, tc := range []struct {
		name   string
		reason string
		// offer returns the note and prover the witness is shown after it
		// cosigned the real log at size 10.
		offer func(t *testing.T, e *env) ([]byte, witness.Prover)
	}{
		{"rollback", "rollback", func(t *testing.T, e *env) ([]byte, witness.Prover) {
			old := openLog(t, e.keys)
			cp := old.grow(t, "a", 6) // the same first entries, fewer of them
			return cp.Note, old.prove
		}},
		{"split view", "split view", func(t *testing.T, e *env) ([]byte, witness.Prover) {
			fork := openLog(t, e.keys)
			cp := fork.grow(t, "b", 10)
			return cp.Note, fork.prove
		}},
		{"fork that grew", "consistency proof", func(t *testing.T, e *env) ([]byte, witness.Prover) {
			fork := openLog(t, e.keys)
			cp := fork.grow(t, "b", 14)
			return cp.Note, fork.prove
		}},
		{"bad proof", "consistency proof", func(t *testing.T, e *env) ([]byte, witness.Prover) {
			cp := e.log.grow(t, "c", 4)
			return cp.Note, func(ctx context.Context, a, b uint64) ([][]byte, error) {
				p, err := e.log.prove(ctx, a, b)
				if err == nil {
					p[0] = bytes.Clone(p[0])
					p[0][0] ^= 1
				}
				return p, err
			}
		}},
		{"short proof", "consistency proof", func(t *testing.T, e *env) ([]byte, witness.Prover) {
			cp := e.log.grow(t, "c", 4)
			return cp.Note, func(ctx context.Context, a, b uint64) ([][]byte, error) {
				p, err := e.log.prove(ctx, a, b)
				return p[:len(p)-1], err
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			e := newEnv(t)
			w := e.witness(t)
			good := e.log.grow(t, "a", 10)
			if _, err := w.Update(ctx, good.Note, e.log.prove); err != nil {
				t.Fatal(err)
			}
			offered, prove := tc.offer(t, e)
			e.clock.Advance(time.Hour)
			_, err := w.Update(ctx, offered, prove)
			var ce *witness.ConflictError
			if !errors.Is(err, audit.ErrInconsistent) || !errors.As(err, &ce) {
				t.Fatalf("update: %v", err)
			}
			if ce.Reason != tc.reason || ce.Last.Size != 10 || ce.Last.Root != good.Root || !bytes.Equal(ce.Offered.Note, offered) {
				t.Fatalf("conflict %q, last %d, offered %d", ce.Reason, ce.Last.Size, ce.Offered.Size)
			}
			for _, want := range []string{tc.reason, "size 10", "evidence in " + ce.Evidence} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			files := evidence(t, e.dir)
			if len(files) != 1 || files[0] != ce.Evidence || ce.Evidence != filepath.Join(e.dir, fmt.Sprintf("conflict-%d.txt", e.clock.Now().Unix())) {
				t.Fatalf("evidence files %v, error names %q", files, ce.Evidence)
			}
			b, err := os.ReadFile(ce.Evidence)
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range [][]byte{good.Note, offered, []byte("reason: " + tc.reason), []byte(e.key.VerifierKey())} {
				if !bytes.Contains(b, want) {
					t.Errorf("evidence lacks %q:\n%s", want, b)
				}
			}
			// The state is unchanged: the same offer is refused again (a
			// second evidence file), the real log is still followed.
			if _, err := w.Update(ctx, offered, prove); !errors.Is(err, audit.ErrInconsistent) {
				t.Fatalf("second offer: %v", err)
			}
			if n := len(evidence(t, e.dir)); n != 2 {
				t.Fatalf("%d evidence files after two conflicts", n)
			}
			if last, _ := w.Last(); last.Size != 10 || last.Root != good.Root {
				t.Fatalf("state moved to size %d", last.Size)
			}
			if st, _ := os.ReadFile(filepath.Join(e.dir, witness.CheckpointFile)); !bytes.Equal(st, good.Note) {
				t.Fatalf("state file changed:\n%s", st)
			}
			if tc.name != "bad proof" && tc.name != "short proof" {
				next := e.log.grow(t, "d", 2)
				got, err := w.Update(ctx, next.Note, e.log.prove)
				if err != nil {
					t.Fatalf("the real log after a conflict: %v", err)
				}
				e.cosigned(t, got, 12)
			}
		})
	}
}

func TestStateSurvivesRestart(t *testing.T) {
	ctx := t.Context()
	e := newEnv(t)
	w := e.witness(t)
	cp := e.log.grow(t, "a", 5)
	if _, err := w.Update(ctx, cp.Note, e.log.prove); err != nil {
		t.Fatal(err)
	}
	// A second process cannot use the state at the same time.
	if _, err := witness.New(e.key, e.vkey, e.dir); !errors.Is(err, witness.ErrLocked) {
		t.Fatalf("second witness on the state: %v", err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Update(ctx, cp.Note, e.log.prove); !errors.Is(err, witness.ErrClosed) {
		t.Fatalf("closed witness: %v", err)
	}

	w = e.witness(t)
	if last, ok := w.Last(); !ok || last.Size != 5 || last.Root != cp.Root {
		t.Fatalf("state after restart: %v %+v", ok, last)
	}
	old := openLog(t, e.keys)
	rolled := old.grow(t, "a", 3)
	if _, err := w.Update(ctx, rolled.Note, old.prove); !errors.Is(err, audit.ErrInconsistent) {
		t.Fatalf("rollback after restart: %v", err)
	}
	next := e.log.grow(t, "b", 1)
	if _, err := w.Update(ctx, next.Note, e.log.prove); err != nil {
		t.Fatal(err)
	}
	w.Close()

	// The state belongs to this log: another log's key is refused, and
	// so is a damaged state file.
	other, err := audit.GenerateKeys(seeded(9))
	if err != nil {
		t.Fatal(err)
	}
	otherPub, err := other.Public("test.fleetlearn/audit")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := witness.New(e.key, otherPub.VerifierKey, e.dir); !errors.Is(err, witness.ErrState) {
		t.Fatalf("state of another log: %v", err)
	}
	if pinned, err := witness.PinnedLogKey(e.dir); err != nil || pinned != e.vkey {
		t.Fatalf("pinned key %q, %v", pinned, err)
	}
	if err := os.WriteFile(filepath.Join(e.dir, witness.CheckpointFile), []byte("garbage\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := witness.New(e.key, e.vkey, e.dir); !errors.Is(err, witness.ErrState) {
		t.Fatalf("damaged state: %v", err)
	}
}

func TestRefusesBadInput(t *testing.T) {
	ctx := t.Context()
	e := newEnv(t)
	w := e.witness(t)
	cp := e.log.grow(t, "a", 2)
	foreign := openLog(t, func() audit.Keys { k, _ := audit.GenerateKeys(seeded(7)); return k }()).grow(t, "a", 2)
	for _, tc := range []struct {
		name string
		note []byte
	}{
		{"not a note", []byte("hello\n")},
		{"another log's key", foreign.Note},
		{"tampered", bytes.Replace(cp.Note, []byte("\n2\n"), []byte("\n3\n"), 1)},
	} {
		if _, err := w.Update(ctx, tc.note, e.log.prove); !errors.Is(err, audit.ErrBadCheckpoint) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	if _, ok := w.Last(); ok {
		t.Fatal("a refused note became the state")
	}
	if _, err := w.Update(ctx, cp.Note, nil); err != nil {
		t.Fatal(err)
	}
	// A proof that cannot be fetched is not a conflict.
	next := e.log.grow(t, "b", 1)
	down := errors.New("log unreachable")
	_, err := w.Update(ctx, next.Note, func(context.Context, uint64, uint64) ([][]byte, error) { return nil, down })
	if !errors.Is(err, down) || errors.Is(err, audit.ErrInconsistent) {
		t.Fatalf("unreachable prover: %v", err)
	}
	if len(evidence(t, e.dir)) != 0 {
		t.Fatal("evidence written for an unreachable log")
	}
	if _, err := witness.New(e.key, "not a key", t.TempDir()); !errors.Is(err, audit.ErrInvalidKeys) {
		t.Fatalf("bad log key: %v", err)
	}
	if _, err := witness.New(audit.WitnessKey{}, e.vkey, t.TempDir()); !errors.Is(err, audit.ErrInvalidKeys) {
		t.Fatalf("empty witness key: %v", err)
	}
}
