package audit

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetlearn/fleetlearn/internal/sqldb"
)

func TestVerifyDataDirIntact(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		dir, cps, keys := tamperLog(t)
		rep, err := VerifyDataDir(ctx, storeTarget(dir))
		if err != nil {
			t.Fatal(err)
		}
		if !rep.IndexChecked || rep.Entries != 60 || rep.Checkpoints != len(cps) || rep.Root != cps[len(cps)-1].Root || rep.KeysPinned {
			t.Fatalf("report %+v", rep)
		}
		// Options reach VerifyExport: the log's own pin passes, another's fails.
		pub := mustPublic(t, keys)
		if rep, err := VerifyDataDir(ctx, storeTarget(dir), WithPin(Pin{PublicKeys: pub})); err != nil || !rep.KeysPinned || !rep.IndexChecked {
			t.Fatalf("with pin: %+v, %v", rep, err)
		}
		other, err := testKeys(t, 12).Public(pub.Origin)
		if err != nil {
			t.Fatal(err)
		}
		rep, err = VerifyDataDir(ctx, storeTarget(dir), WithPin(Pin{PublicKeys: other}))
		wantVerifyError(t, err, -1, ErrKeyMismatch)
		if rep.IndexChecked {
			t.Error("IndexChecked on a failed verification")
		}
		if onPostgres(t) {
			return
		}
		// The database file itself names the log too.
		if _, err := VerifyDataDir(ctx, filepath.Join(dir, DBFile)); err != nil {
			t.Errorf("database file: %v", err)
		}
		if _, err := VerifyDataDir(ctx, filepath.Join(t.TempDir(), "missing")); err == nil {
			t.Error("a missing folder verified")
		}
	})
}

// Every query column of the entries table is checked against the signed
// entry: a row changed in one of them fails, naming the row and the
// column, before anything is exported.
func TestVerifyDataDirIndexColumns(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		for i, tc := range []struct {
			column     string
			set        string // SQL assignment
			sqliteOnly bool   // PostgreSQL's columns hold their declared type only
		}{
			{"type", "type = 'hidden.event'", false},
			{"actor_kind", "actor_kind = CASE actor_kind WHEN 'operator' THEN 'service' ELSE 'operator' END", false},
			{"actor", "actor = actor || '-x'", false},
			{"task", "task = 't-hidden'", false},
			{"round", "round = round + 100", false},
			{"ts", "ts = ts + 1", false},
			// Same value, another storage class: SQLite never matches a BLOB
			// against the TEXT a query binds, so these
			// hide the row from queries as well.
			{"type", "type = CAST(type AS BLOB)", true},
			{"task", "task = CAST(task AS BLOB)", true},
			{"actor", "actor = CAST(actor AS BLOB)", true},
			{"actor_kind", "actor_kind = CAST(actor_kind AS BLOB)", true},
			{"round", "round = 'x'", true},
			{"ts", "ts = 1.5", true},
		} {
			if tc.sqliteOnly && onPostgres(t) {
				continue
			}
			t.Run(tc.set, func(t *testing.T) {
				dir, _, _ := tamperLog(t)
				row := int64(7 + 4*i) // a different row for each case
				tamper(t, dir, func(db *sqldb.DB) {
					mustExec(t, db, "UPDATE entries SET "+tc.set+" WHERE idx = ?", row)
				})
				rep, err := VerifyDataDir(ctx, storeTarget(dir))
				ve := wantVerifyError(t, err, row, ErrIndexMismatch, ErrCorrupt, ErrTampered)
				if ve.Checkpoint != -1 {
					t.Errorf("checkpoint %d, want -1", ve.Checkpoint)
				}
				if !strings.Contains(err.Error(), "column "+tc.column+" is ") {
					t.Errorf("%q does not name column %s", err, tc.column)
				}
				if rep.IndexChecked {
					t.Error("IndexChecked on a failed verification")
				}
				// An export carries no index: the same log verifies from one.
				if _, err := VerifyExport(bytes.NewReader(exportReadOnly(t, dir))); err != nil {
					t.Errorf("export of the log with a damaged index: %v", err)
				}
			})
		}
	})
}

// A changed byte of an entry's data fails too, as VerifyExport names it:
// the index check leaves an entry it cannot read to the signature check.
func TestVerifyDataDirTamperedEntry(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		dir, _, _ := tamperLog(t)
		tamper(t, dir, func(db *sqldb.DB) {
			var data []byte
			if err := db.QueryRow("SELECT data FROM entries WHERE idx = 41").Scan(&data); err != nil {
				t.Fatal(err)
			}
			// A character of the signature, so the event still reads as the
			// index says and only the signature check can tell.
			i := len(data) - 10
			if data[i] == 'A' {
				data[i] = 'B'
			} else {
				data[i] = 'A'
			}
			mustExec(t, db, "UPDATE entries SET data = ? WHERE idx = 41", data)
		})
		rep, err := VerifyDataDir(context.Background(), storeTarget(dir))
		wantVerifyError(t, err, 41, ErrTampered, ErrBadSignature)
		if errors.Is(err, ErrIndexMismatch) || rep.IndexChecked {
			t.Errorf("index mismatch %v, IndexChecked %v: the index agrees with the entry's event", errors.Is(err, ErrIndexMismatch), rep.IndexChecked)
		}

		// A byte of the payload: the event no longer parses, or no longer
		// matches its index row; either way entry 41 is named.
		dir, _, _ = tamperLog(t)
		tamper(t, dir, func(db *sqldb.DB) {
			var data []byte
			if err := db.QueryRow("SELECT data FROM entries WHERE idx = 41").Scan(&data); err != nil {
				t.Fatal(err)
			}
			i := bytes.IndexByte(data, '.') + 40
			if data[i] == 'A' {
				data[i] = 'B'
			} else {
				data[i] = 'A'
			}
			mustExec(t, db, "UPDATE entries SET data = ? WHERE idx = 41", data)
		})
		_, err = VerifyDataDir(context.Background(), storeTarget(dir))
		wantVerifyError(t, err, 41, ErrTampered)
	})
}
