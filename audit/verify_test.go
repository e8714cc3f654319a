package audit

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"strings"
	"testing"

	"github.com/fleetlearn/fleetlearn/audit/internal/merkle"
	"github.com/fleetlearn/fleetlearn/internal/sqldb"
)

// tamperLog builds a closed log of 60 entries with a checkpoint after every
// 10 and returns its folder and checkpoints.
func tamperLog(t *testing.T) (string, []Checkpoint, Keys) {
	t.Helper()
	ctx := context.Background()
	keys := testKeys(t, 11)
	lg, dir, _ := openTest(t, WithKeys(keys))
	var cps []Checkpoint
	for range 6 {
		appendN(t, lg, 10)
		cp, err := lg.Checkpoint(ctx)
		if err != nil {
			t.Fatal(err)
		}
		cps = append(cps, cp)
	}
	if err := lg.Close(); err != nil {
		t.Fatal(err)
	}
	return dir, cps, keys
}

func exportReadOnly(t *testing.T, dir string, opts ...ExportOption) []byte {
	t.Helper()
	ro, err := OpenReadOnly(context.Background(), storeTarget(dir))
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	return exportBytes(t, ro, opts...)
}

func wantVerifyError(t *testing.T, err error, index int64, sentinels ...error) *VerifyError {
	t.Helper()
	var ve *VerifyError
	if !errors.As(err, &ve) {
		t.Fatalf("got %v, want a *VerifyError", err)
	}
	if ve.Index != index {
		t.Errorf("first bad index %d, want %d (%v)", ve.Index, index, err)
	}
	for _, s := range sentinels {
		if !errors.Is(err, s) {
			t.Errorf("%v does not wrap %v", err, s)
		}
	}
	t.Log(err)
	return ve
}

func TestVerifyExportClean(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		dir, cps, keys := tamperLog(t)
		exp := exportReadOnly(t, dir, WithInclusionProofs(0, 5, 59), WithConsistencyProofs(1, 10, 33, 60))
		rep, err := VerifyExport(bytes.NewReader(exp), WithEntryKey(keys.Entry.Public().(ed25519.PublicKey)),
			WithVerifierKey(mustPublic(t, keys).VerifierKey), WithTrustedCheckpoint(cps[2].Note))
		if err != nil {
			t.Fatal(err)
		}
		if rep.Entries != 60 || rep.Checkpoints != 6 || rep.Proofs != 7 || rep.Trusted != 1 || !rep.KeysPinned ||
			rep.Root != cps[5].Root || rep.Checkpoint.Size != 60 || rep.Uncovered != 0 || rep.Origin != "test.fleetlearn/audit" {
			t.Fatalf("report %+v", rep)
		}
		var total uint64
		for _, n := range rep.Types {
			total += n
		}
		if total != 60 || rep.Types[TypeRoundOpened] != 12 || !rep.First.Before(rep.Last) {
			t.Fatalf("types %v, times %v %v", rep.Types, rep.First, rep.Last)
		}
		// Latest checkpoint only, one worker: same result.
		rep2, err := VerifyExport(bytes.NewReader(exportReadOnly(t, dir, WithLatestCheckpointOnly())), WithWorkers(1))
		if err != nil || rep2.Checkpoints != 1 || rep2.Root != rep.Root {
			t.Fatalf("latest only: %+v, %v", rep2, err)
		}
	})
}

func mustPublic(t *testing.T, keys Keys) PublicKeys {
	t.Helper()
	pub, err := keys.Public("test.fleetlearn/audit")
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

func tamper(t *testing.T, dir string, fn func(db *sqldb.DB)) {
	t.Helper()
	db := rawDB(t, dir)
	fn(db)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestTamperOneByte(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		dir, _, _ := tamperLog(t)
		tamper(t, dir, func(db *sqldb.DB) {
			var data []byte
			if err := db.QueryRow("SELECT data FROM entries WHERE idx = 23").Scan(&data); err != nil {
				t.Fatal(err)
			}
			// One base64url character of the payload, swapped for another.
			i := bytes.IndexByte(data, '.') + 40
			if data[i] == 'A' {
				data[i] = 'B'
			} else {
				data[i] = 'A'
			}
			mustExec(t, db, "UPDATE entries SET data = ? WHERE idx = 23", data)
		})
		_, err := VerifyExport(bytes.NewReader(exportReadOnly(t, dir)))
		wantVerifyError(t, err, 23, ErrTampered, ErrBadSignature)
	})
}

func TestTamperDeleteRow(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		dir, _, _ := tamperLog(t)
		tamper(t, dir, func(db *sqldb.DB) { mustExec(t, db, "DELETE FROM entries WHERE idx = 17") })
		_, err := VerifyExport(bytes.NewReader(exportReadOnly(t, dir)))
		wantVerifyError(t, err, 17, ErrTampered)
		if !strings.Contains(err.Error(), "missing") {
			t.Errorf("error does not say the entry is missing: %v", err)
		}
	})
}

func TestTamperReorderRows(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		dir, _, _ := tamperLog(t)
		tamper(t, dir, func(db *sqldb.DB) {
			// Swap rows 30 and 31 entirely, index columns and leaf hashes too.
			mustExec(t, db, "UPDATE entries SET idx = -1 WHERE idx = 30")
			mustExec(t, db, "UPDATE entries SET idx = 30 WHERE idx = 31")
			mustExec(t, db, "UPDATE entries SET idx = 31 WHERE idx = -1")
			mustExec(t, db, "UPDATE nodes SET id = -1 WHERE id = 30")
			mustExec(t, db, "UPDATE nodes SET id = 30 WHERE id = 31")
			mustExec(t, db, "UPDATE nodes SET id = 31 WHERE id = -1")
		})
		_, err := VerifyExport(bytes.NewReader(exportReadOnly(t, dir)))
		wantVerifyError(t, err, 30, ErrTampered, ErrBadSignature)
	})
}

func TestTamperOlderCheckpoint(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		dir, cps, _ := tamperLog(t)
		tamper(t, dir, func(db *sqldb.DB) {
			mustExec(t, db, "UPDATE checkpoints SET note = ? WHERE seq = (SELECT max(seq) FROM checkpoints)", cps[2].Note)
		})
		_, err := VerifyExport(bytes.NewReader(exportReadOnly(t, dir)))
		ve := wantVerifyError(t, err, 50, ErrTampered, ErrInconsistent)
		if ve.Checkpoint != 5 {
			t.Errorf("checkpoint %d, want 5", ve.Checkpoint)
		}
		// With only the latest checkpoint exported, the entries after the
		// older checkpoint are not vouched for.
		_, err = VerifyExport(bytes.NewReader(exportReadOnly(t, dir, WithLatestCheckpointOnly())))
		wantVerifyError(t, err, 30, ErrTampered, ErrUncovered)
	})
}

// TestTamperResigned plays an operator who holds the entry key: the edited
// entry has a valid signature, so only the tree gives it away.
func TestTamperResigned(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		for _, fixLeaf := range []bool{false, true} {
			dir, _, keys := tamperLog(t)
			tamper(t, dir, func(db *sqldb.DB) {
				var data []byte
				if err := db.QueryRow("SELECT data FROM entries WHERE idx = 23").Scan(&data); err != nil {
					t.Fatal(err)
				}
				ev, err := Entry{Index: 23, Data: data}.Event()
				if err != nil {
					t.Fatal(err)
				}
				ev.Actor = Operator("someone-else")
				payload, err := ev.MarshalCanonical()
				if err != nil {
					t.Fatal(err)
				}
				kid, _ := keyID(keys.Entry.Public().(ed25519.PublicKey))
				forged, err := entrySigner{priv: keys.Entry, kid: kid}.sign(23, payload)
				if err != nil {
					t.Fatal(err)
				}
				mustExec(t, db, "UPDATE entries SET data = ?, actor = 'someone-else' WHERE idx = 23", forged)
				if fixLeaf {
					h := merkle.LeafHash(forged)
					mustExec(t, db, "UPDATE nodes SET hash = ? WHERE id = 23", h[:])
				}
			})
			_, err := VerifyExport(bytes.NewReader(exportReadOnly(t, dir)))
			if !fixLeaf {
				wantVerifyError(t, err, 23, ErrTampered, ErrRootMismatch)
				continue
			}
			// The stored leaf hash was fixed up too: the checkpoint over
			// [0, 30) no longer matches, and the last good one covered 20.
			ve := wantVerifyError(t, err, 20, ErrTampered, ErrRootMismatch)
			if ve.Checkpoint != 2 {
				t.Errorf("checkpoint %d, want 2", ve.Checkpoint)
			}
		}
	})
}

// TestTamperTruncated removes the newest entries and the checkpoints that
// cover them: the export is a consistent older log, which only a checkpoint
// the auditor kept can expose.
func TestTamperTruncated(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		dir, cps, _ := tamperLog(t)
		tamper(t, dir, func(db *sqldb.DB) {
			mustExec(t, db, "DELETE FROM entries WHERE idx >= 40")
			mustExec(t, db, "DELETE FROM checkpoints WHERE size > 40")
		})
		exp := exportReadOnly(t, dir)
		if _, err := VerifyExport(bytes.NewReader(exp)); err != nil {
			t.Fatalf("a consistent prefix should verify on its own: %v", err)
		}
		_, err := VerifyExport(bytes.NewReader(exp), WithTrustedCheckpoint(cps[5].Note))
		wantVerifyError(t, err, 40, ErrTampered, ErrInconsistent)
	})
}

func TestVerifyExportFileDamage(t *testing.T) {
	dir, _, _ := tamperLog(t)
	exp := exportReadOnly(t, dir, WithInclusionProofs(7))
	lines := strings.SplitAfter(string(exp), "\n")
	lines = lines[:len(lines)-1] // the empty string after the last newline
	join := func(ls []string) []byte { return []byte(strings.Join(ls, "")) }
	otherKeys := testKeys(t, 12)
	cases := map[string]struct {
		data []byte
		opts []VerifyOption
		want error
	}{
		"truncated":      {join(lines[:len(lines)-1]), nil, ErrExportFormat},
		"cut mid-entry":  {exp[:len(exp)/2], nil, ErrExportFormat},
		"extra line":     {append(bytes.Clone(exp), "{}\n"...), nil, ErrExportFormat},
		"empty":          {nil, nil, ErrExportFormat},
		"not JSON":       {[]byte("hello\n"), nil, ErrExportFormat},
		"pinned entry":   {exp, []VerifyOption{WithEntryKey(otherKeys.Entry.Public().(ed25519.PublicKey))}, ErrKeyMismatch},
		"pinned vkey":    {exp, []VerifyOption{WithVerifierKey("x+00000000+AQ==")}, ErrKeyMismatch},
		"unknown member": {[]byte(strings.Replace(string(exp), `"kind":"end"`, `"kind":"end","x":1`, 1)), nil, ErrExportFormat},
		"proof altered":  {[]byte(strings.Replace(string(exp), `"proof":["`, `"proof":["00`, 1)), nil, ErrExportFormat},
		"proof swapped": {[]byte(strings.Replace(string(exp), `"kind":"inclusion","index":7`, `"kind":"inclusion","index":8`, 1)),
			nil, ErrInvalidProof},
		"foreign checkpoint": {[]byte(strings.Replace(string(exp), "test.fleetlearn/audit\\n", "other\\n", 1)), nil, ErrBadCheckpoint},
	}
	for name, tc := range cases {
		_, err := VerifyExport(bytes.NewReader(tc.data), tc.opts...)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
		var ve *VerifyError
		if !errors.As(err, &ve) {
			t.Errorf("%s: not a *VerifyError: %v", name, err)
		}
	}
	if _, err := VerifyExport(bytes.NewReader(exp)); err != nil {
		t.Fatalf("control: %v", err)
	}
}

func TestUncoveredTail(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		lg, dir, _ := openTest(t)
		appendN(t, lg, 5)
		if _, err := lg.Checkpoint(ctx); err != nil {
			t.Fatal(err)
		}
		appendN(t, lg, 3)
		// A reader that saw the entries before the next checkpoint.
		exp := exportReadOnly(t, dir)
		_, err := VerifyExport(bytes.NewReader(exp))
		wantVerifyError(t, err, 5, ErrUncovered)
		rep, err := VerifyExport(bytes.NewReader(exp), WithUncoveredTail())
		if err != nil || rep.Uncovered != 3 || rep.Entries != 8 {
			t.Fatalf("with uncovered tail: %+v, %v", rep, err)
		}
		// The writable log signs before exporting.
		if _, err := VerifyExport(bytes.NewReader(exportBytes(t, lg))); err != nil {
			t.Fatal(err)
		}
	})
}

// TestExportWhileAppending exports a log that keeps growing: each export
// stops at the checkpoint it signed and verifies.
func TestExportWhileAppending(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		lg, _, _ := openTest(t)
		done := make(chan struct{})
		errc := make(chan error, 1)
		go func() {
			defer close(errc)
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				if _, err := lg.Append(ctx, sampleEvent(t, i)); err != nil {
					errc <- err
					return
				}
			}
		}()
		var last uint64
		grew := 0
		for i := 0; grew < 3 && i < 1000; i++ {
			rep, err := VerifyExport(bytes.NewReader(exportBytes(t, lg)))
			if err != nil {
				t.Fatal(err)
			}
			if rep.Entries < last || rep.Uncovered != 0 || rep.Checkpoint.Size != rep.Entries {
				t.Fatalf("report %+v after %d", rep, last)
			}
			if rep.Entries > last {
				grew++
			}
			last = rep.Entries
		}
		if grew < 3 {
			t.Fatalf("the log grew between only %d exports", grew)
		}
		close(done)
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	})
}

func TestVerifyIndex(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		lg, dir, _ := openTest(t)
		appendN(t, lg, 20)
		if err := lg.VerifyIndex(ctx); err != nil {
			t.Fatal(err)
		}
		tamper(t, dir, func(db *sqldb.DB) { mustExec(t, db, "UPDATE entries SET type = 'hidden.event' WHERE idx = 13") })
		err := lg.VerifyIndex(ctx)
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "entry 13") {
			t.Fatalf("VerifyIndex: %v", err)
		}
	})
}
