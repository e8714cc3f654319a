package witness_test

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/audit/witness"
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

// The reproduction of a rollback that passed an hour's max age: the
// operator restores a copy of the log from three minutes back, which holds
// the witness's genuine cosignature of its own latest checkpoint. Verified
// offline it passes; held to the newest checkpoint the witness itself
// cosigned, as the default is, it fails, naming both sizes. A fork fails
// too, and the honest log passes.
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
	// own is what the witness itself holds, as an auditor reads it.
	own := func() []byte {
		b, err := witness.ReadCosigned(e.dir)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if _, err := witness.ReadCosigned(e.dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("cosigned file before the first cosignature: %v", err)
	}
	maxAge := func(now time.Time) audit.VerifyOption {
		return audit.WithWitnessMaxAge(time.Hour, func() time.Time { return now })
	}
	verify := func(exp []byte, now time.Time, views ...[]byte) (audit.Report, error) {
		opts := []audit.VerifyOption{audit.WithWitness(wkey), maxAge(now)}
		for _, v := range views {
			opts = append(opts, audit.WithWitnessCheckpoint(v))
		}
		return audit.VerifyExport(bytes.NewReader(exp), opts...)
	}
	offline := func(exp []byte, now time.Time) (audit.Report, error) {
		return audit.VerifyExport(bytes.NewReader(exp), audit.WithWitness(wkey), maxAge(now), audit.WithWitnessOffline())
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

	e.clock.Advance(3 * time.Minute)
	lg = open(dir)
	cp2 := lg.grow(t, "after", 9)
	if err := cosign(lg, cp2); err != nil {
		t.Fatal(err)
	}
	lg.Close()
	view := own() // fetched by the auditor before exporting
	now := e.clock.Now().Add(time.Minute)

	rep, err := verify(export(dir), now, view)
	if err != nil || len(rep.Witnessed) != 1 || rep.Witnessed[0].Size != cp2.Size || rep.Witnessed[0].OwnSize != cp2.Size || !rep.Witnessed[0].OwnTime.Equal(e.clock.Now()) {
		t.Fatalf("the live log: %+v, %v", rep.Witnessed, err)
	}

	// Rolled back to the checkpoint of size 6: every signature in it is
	// genuine, and it carries the witness's cosignature of that
	// checkpoint, four minutes old.
	rolled := export(old)
	if _, err := audit.VerifyExport(bytes.NewReader(rolled)); err != nil {
		t.Fatalf("a plain verify of the rolled-back log: %v (it is expected to pass)", err)
	}
	if rep, err := offline(rolled, now); err != nil || rep.Witnessed[0].Size != cp1.Size {
		t.Fatalf("offline, the rolled-back log's fresh cosignature passes an hour's max age: %+v, %v", rep.Witnessed, err)
	}
	_, err = verify(rolled, now, view)
	var ve *audit.VerifyError
	if !errors.As(err, &ve) || !errors.Is(err, audit.ErrInconsistent) || ve.Index != int64(cp1.Size) ||
		!strings.Contains(err.Error(), fmt.Sprintf("size %d", cp2.Size)) || !strings.Contains(err.Error(), fmt.Sprintf("only %d entries", cp1.Size)) || !strings.Contains(err.Error(), "rolled back") {
		t.Fatalf("rolled back, held to the witness's checkpoint: %v", err)
	}
	// Without the witness's own checkpoint there is no verdict, unless
	// offline is asked for.
	if _, err := verify(rolled, now); !errors.Is(err, audit.ErrNoWitnessCheckpoint) || errors.As(err, &ve) {
		t.Fatalf("no witness checkpoint: %v", err)
	}
	// The witness, shown the rolled-back log, refuses it and keeps its
	// own newest checkpoint.
	rl := open(old)
	if err := cosign(rl, mustLatest(t, rl)); !errors.Is(err, audit.ErrInconsistent) {
		t.Fatalf("witness on the rolled-back log: %v", err)
	}
	rl.Close()
	if !bytes.Equal(own(), view) {
		t.Fatal("the witness's cosigned file changed at a conflict")
	}

	// Forked from the old state to as many entries as the witness saw:
	// the witness refuses its checkpoint, and the fork's tree at that
	// size is not the one the witness cosigned.
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
	_, err = verify(forked, now, view)
	if !errors.As(err, &ve) || !errors.Is(err, audit.ErrInconsistent) || ve.Index != int64(cp2.Size) || !strings.Contains(err.Error(), "fork") {
		t.Fatalf("forked: %v", err)
	}
	if _, err := offline(forked, now); !errors.Is(err, audit.ErrNotCosigned) {
		t.Fatalf("forked, offline: %v", err)
	}

	// The witness's checkpoint ages: two hours later it no longer rules
	// out a rollback since, and the honest log fails until it is fetched
	// again; with no bound on its age it passes.
	later := now.Add(2 * time.Hour)
	if _, err := verify(export(dir), later, view); !errors.As(err, &ve) || !errors.Is(err, audit.ErrNotCosigned) || !strings.Contains(err.Error(), "Fetch the witness's checkpoint again") {
		t.Fatalf("an old witness checkpoint: %v", err)
	}
	if _, err := audit.VerifyExport(bytes.NewReader(export(dir)), audit.WithWitness(wkey), audit.WithWitnessCheckpoint(view),
		audit.WithWitnessMaxAge(0, func() time.Time { return later })); err != nil {
		t.Fatalf("an old witness checkpoint, any age: %v", err)
	}

	// The witness's checkpoint is authenticated by its key: an altered
	// cosignature, or one of a witness not required, is refused.
	bad := bytes.Clone(view)
	bad[len(bad)-3] ^= 'A' ^ 'B'
	if _, err := verify(export(dir), now, bad); err == nil || !errors.Is(err, audit.ErrTampered) {
		t.Fatalf("altered witness checkpoint: %v", err)
	}
	other, err := audit.GenerateWitnessKey(seeded(9), "witness.example/other")
	if err != nil {
		t.Fatal(err)
	}
	notRequired, err := other.Cosign(cp2, e.clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := verify(export(dir), now, notRequired); !errors.Is(err, audit.ErrNoWitnessCheckpoint) {
		t.Fatalf("checkpoint of a witness not required: %v", err)
	}
}

func mustLatest(t *testing.T, lg testLog) audit.Checkpoint {
	t.Helper()
	cp, err := lg.Latest(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return cp
}
