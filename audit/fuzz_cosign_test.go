package audit

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/internal/sqldb"
)

// cosignFixture is a log that accepts one witness's cosignatures, with the
// checkpoints it issued and notes to cosign.
type cosignFixture struct {
	lg      *Log
	db      *sqldb.DB // the log's database, read directly
	clk     *stepClock
	logVKey string
	w       WitnessKey
	issued  []Checkpoint
	seeds   []cosignSeed
}

type cosignSeed struct {
	file string
	note []byte
}

func newCosignFixture(tb testing.TB) cosignFixture {
	tb.Helper()
	keys := testKeys(tb, 31)
	w := testWitness(tb, "witness.example/w1", 3)
	other := testWitness(tb, "witness.example/w2", 4)
	lg, dir, clk := openTest(tb, WithKeys(keys), WithWitnesses(w.VerifierKey()))
	fx := cosignFixture{lg: lg, db: rawDB(tb, dir), clk: clk, logVKey: lg.PublicKeys().VerifierKey, w: w}
	for _, n := range []int{3, 2, 2} {
		fx.issued = append(fx.issued, grownCheckpoint(tb, lg, n))
	}
	latest := fx.issued[len(fx.issued)-1]
	// A log with the same keys and origin signs a checkpoint this one
	// never issued, as a lost or forked copy of the log would.
	twin, _, _ := openTest(tb, WithKeys(keys))
	unissued := grownCheckpoint(tb, twin, 4)
	// A log with other keys under the same origin.
	stranger, _, _ := openTest(tb, WithKeys(testKeys(tb, 32)))
	foreign := grownCheckpoint(tb, stranger, 7)

	cosign := func(k WitnessKey, cp Checkpoint, at time.Time) []byte {
		tb.Helper()
		msg, err := k.Cosign(cp, at)
		if err != nil {
			tb.Fatal(err)
		}
		return msg
	}
	valid := cosign(w, latest, t0)
	// The witness's line with one bit of its Ed25519 signature flipped.
	lines := strings.Split(strings.TrimSuffix(string(valid), "\n"), "\n")
	last := lines[len(lines)-1]
	raw, err := base64.StdEncoding.DecodeString(last[strings.LastIndexByte(last, ' ')+1:])
	if err != nil || len(raw) != 76 {
		tb.Fatalf("cosignature line %q: %v", last, err)
	}
	raw[40] ^= 1
	lines[len(lines)-1] = "— " + w.Name() + " " + base64.StdEncoding.EncodeToString(raw)
	badSig := []byte(strings.Join(lines, "\n") + "\n")
	both := cosign(other, Checkpoint{Origin: latest.Origin, Size: latest.Size, Root: latest.Root, Note: valid}, t0)
	fx.seeds = []cosignSeed{
		{"valid", valid},
		{"valid-newer", cosign(w, latest, t0.Add(time.Minute))},
		{"valid-first-checkpoint", cosign(w, fx.issued[0], t0)},
		{"two-witnesses", both},
		{"bad-signature", badSig},
		{"other-witness", cosign(other, latest, t0)},
		{"unissued-checkpoint", cosign(w, unissued, t0)},
		{"future", cosign(w, latest, t0.Add(time.Hour))},
		{"not-cosigned", latest.Note},
		{"other-log-key", cosign(w, foreign, t0)},
	}
	return fx
}

// FuzzAddCosignature feeds arbitrary notes to the log's store of
// cosignatures, as a witness's RPC would. The log keeps only cosignatures
// that verify, of checkpoints it issued, and refuses the rest with its
// documented errors; the package's VerifyCosignature agrees with it on
// every note.
func FuzzAddCosignature(f *testing.F) {
	fx := newCosignFixture(f)
	for _, s := range fx.seeds {
		f.Add(s.note)
	}
	ctx := context.Background()
	wkey := fx.w.VerifierKey()
	checked := "" // the store as the last full check saw it
	f.Fuzz(func(t *testing.T, b []byte) {
		fx.clk.Set(t0) // the same verdict on a note at every run
		cs, err := fx.lg.AddCosignature(ctx, b)
		vcp, vt, verr := VerifyCosignature(b, fx.logVKey, wkey)
		if verr != nil {
			if n := countIs(verr, ErrBadCheckpoint, ErrNotCosigned, ErrBadCosignature, ErrInvalidKeys); n != 1 {
				t.Fatalf("VerifyCosignature error wraps %d of the documented errors: %v", n, verr)
			}
		}
		issued := -1
		for i, cp := range fx.issued {
			if verr == nil && cp.Size == vcp.Size && cp.Root == vcp.Root {
				issued = i
			}
		}
		if err != nil {
			if n := countIs(err, ErrBadCheckpoint, ErrUnknownWitness, ErrBadCosignature, ErrNotFound, ErrTooLarge); n != 1 {
				t.Fatalf("AddCosignature error wraps %d of the documented errors: %v", n, err)
			}
			// A note VerifyCosignature accepts, of a checkpoint the log
			// issued and dated within the allowed skew of its clock, is
			// the log's to keep.
			if issued >= 0 && !vt.After(t0.Add(maxCosignatureSkew)) {
				t.Fatalf("refused a valid cosignature of checkpoint %d at %s: %v", vcp.Size, vt, err)
			}
		} else {
			if verr != nil || issued < 0 {
				t.Fatalf("stored a cosignature VerifyCosignature refuses (%v) or of a checkpoint the log did not issue: %+v", verr, cs)
			}
			if cs.Witness != wkey || cs.Name != fx.w.Name() || cs.Size != vcp.Size || !cs.Time.Equal(vt) {
				t.Fatalf("stored %+v, the note says size %d at %s", cs, vcp.Size, vt)
			}
		}
		// Whatever the note, every stored cosignature verifies in the
		// checkpoint it was stored for, and the one just accepted (or a
		// newer one) is there. The store's rows are read directly first, so
		// that the full check runs only when they changed.
		st := fx.store(t)
		if err != nil && st == checked {
			return
		}
		checked = st
		for i, cp := range fx.issued {
			msg, err2 := fx.lg.CosignedNote(ctx, cp)
			if err2 != nil {
				t.Fatal(err2)
			}
			got, at, err2 := VerifyCosignature(msg, fx.logVKey, wkey)
			stored := err == nil && i == issued
			if errors.Is(err2, ErrNotCosigned) && !stored {
				continue
			}
			if err2 != nil {
				t.Fatalf("the cosigned note of checkpoint %d does not verify: %v\n%q", cp.Size, err2, msg)
			}
			if got.Size != cp.Size || got.Root != cp.Root || !bytes.HasPrefix(msg, cp.Note[:bytes.LastIndex(cp.Note, []byte("\n\n"))+2]) {
				t.Fatalf("the cosigned note of checkpoint %d is of another checkpoint:\n%q", cp.Size, msg)
			}
			if stored && at.Before(cs.Time) {
				t.Fatalf("checkpoint %d: stored cosignature of %s, just accepted one of %s", cp.Size, at, cs.Time)
			}
		}
	})
}

// store is every row of the cosignatures table, in one string.
func (fx cosignFixture) store(tb testing.TB) string {
	tb.Helper()
	var s sql.NullString
	if err := fx.db.QueryRow(`SELECT group_concat(witness || ' ' || size || ' ' || hex(root) || ' ' || name || ' ' || time || ' ' || hex(sig), ';')
		FROM (SELECT * FROM cosignatures ORDER BY witness, size)`).Scan(&s); err != nil {
		tb.Fatal(err)
	}
	return s.String
}

func countIs(err error, targets ...error) int {
	n := 0
	for _, t := range targets {
		if errors.Is(err, t) {
			n++
		}
	}
	return n
}

// TestWriteCosignFuzzSeeds rewrites testdata/fuzz/FuzzAddCosignature when
// run with -update-seeds.
func TestWriteCosignFuzzSeeds(t *testing.T) {
	if !*updateSeeds {
		t.Skip("run with -update-seeds to rewrite testdata/fuzz")
	}
	fx := newCosignFixture(t)
	dir := filepath.Join("testdata", "fuzz", "FuzzAddCosignature")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, s := range fx.seeds {
		body := "go test fuzz v1\n[]byte(" + strconv.Quote(string(s.note)) + ")\n"
		if err := os.WriteFile(filepath.Join(dir, s.file), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
