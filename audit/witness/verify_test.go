package witness_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/audit"
)

// copyDir copies a closed log's folder: the state an operator could
// restore to roll the log back.
func copyDir(t *testing.T, from string) string {
	t.Helper()
	to := t.TempDir()
	ents, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return to
}

// An auditor who pins a witness catches a log rolled back to a checkpoint
// boundary, and a forked one, without any checkpoint of their own; a plain
// verify passes both.
func TestVerifyWithWitnessCatchesRollbackAndFork(t *testing.T) {
	ctx := t.Context()
	e := newEnv(t)
	w := e.witness(t)
	wkey := e.key.VerifierKey()
	dir := t.TempDir()
	open := func(dir string) testLog {
		lg, err := audit.Open(ctx, dir, audit.WithKeys(e.keys), audit.WithOrigin("test.fleetlearn/audit"), audit.WithWitnesses(wkey))
		if err != nil {
			t.Fatal(err)
		}
		return testLog{lg}
	}
	cosign := func(lg testLog, cp audit.Checkpoint) error {
		msg, err := w.Update(ctx, cp.Note, lg.prove)
		if err != nil {
			return err
		}
		_, err = lg.AddCosignature(ctx, msg)
		return err
	}
	export := func(dir string) []byte {
		lg, err := audit.OpenReadOnly(ctx, dir)
		if err != nil {
			t.Fatal(err)
		}
		defer lg.Close()
		var b bytes.Buffer
		if err := lg.Export(ctx, &b); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	verify := func(exp []byte, now time.Time) (audit.Report, error) {
		return audit.VerifyExport(bytes.NewReader(exp), audit.WithWitness(wkey),
			audit.WithWitnessMaxAge(10*time.Minute, func() time.Time { return now }))
	}

	lg := open(dir)
	cp1 := lg.grow(t, "before", 6)
	if err := cosign(lg, cp1); err != nil {
		t.Fatal(err)
	}
	if err := lg.Close(); err != nil {
		t.Fatal(err)
	}
	old := copyDir(t, dir) // the state the operator will restore

	e.clock.Advance(time.Hour)
	lg = open(dir)
	cp2 := lg.grow(t, "after", 9)
	if err := cosign(lg, cp2); err != nil {
		t.Fatal(err)
	}
	lg.Close()
	now := e.clock.Now().Add(time.Minute)

	rep, err := verify(export(dir), now)
	if err != nil || len(rep.Witnessed) != 1 || rep.Witnessed[0].Size != cp2.Size {
		t.Fatalf("the live log: %+v, %v", rep.Witnessed, err)
	}

	// Rolled back to the checkpoint of size 6: every signature in it is
	// genuine, and it even carries the witness's cosignature of that
	// checkpoint, from an hour before.
	rolled := export(old)
	if _, err := audit.VerifyExport(bytes.NewReader(rolled)); err != nil {
		t.Fatalf("a plain verify of the rolled-back log: %v (it is expected to pass)", err)
	}
	_, err = verify(rolled, now)
	var ve *audit.VerifyError
	if !errors.As(err, &ve) || !errors.Is(err, audit.ErrNotCosigned) || ve.Index != int64(cp1.Size) || !strings.Contains(err.Error(), "ago") {
		t.Fatalf("rolled back: %v", err)
	}

	// Forked from the old state: the witness refuses its checkpoint, so
	// it has no cosignature of its own latest checkpoint.
	fork := open(old)
	cpf := fork.grow(t, "fork", 9)
	if err := cosign(fork, cpf); !errors.Is(err, audit.ErrInconsistent) {
		t.Fatalf("witness on the fork: %v", err)
	}
	fork.Close()
	forked := export(old)
	if _, err := audit.VerifyExport(bytes.NewReader(forked)); err != nil {
		t.Fatalf("a plain verify of the fork: %v (it is expected to pass)", err)
	}
	_, err = verify(forked, now)
	if !errors.As(err, &ve) || !errors.Is(err, audit.ErrNotCosigned) || ve.Index != int64(cpf.Size) {
		t.Fatalf("forked: %v", err)
	}
}
