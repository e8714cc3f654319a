package audit

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/audit/internal/merkle"
	"github.com/fleetlearn/fleetlearn/internal/sqldb"
)

func TestAppendProofsAndCheckpoints(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		lg, _, _ := openTest(t)
		if _, err := lg.Latest(ctx); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Latest on a new log: %v", err)
		}
		cp0, err := lg.Checkpoint(ctx)
		if err != nil || cp0.Size != 0 || cp0.Root != merkle.EmptyRoot {
			t.Fatalf("first checkpoint: %+v, %v", cp0, err)
		}
		var entries []Entry
		var cps []Checkpoint
		var want []Event
		for round := range 5 {
			n := 7 + round*13
			entries = append(entries, appendN(t, lg, n)...)
			for i := range n {
				want = append(want, sampleEvent(t, i))
			}
			cp, err := lg.Checkpoint(ctx)
			if err != nil {
				t.Fatal(err)
			}
			cps = append(cps, cp)
		}
		// Unchanged size: the same checkpoint comes back, nothing is signed.
		again, err := lg.Checkpoint(ctx)
		if err != nil || !bytes.Equal(again.Note, cps[len(cps)-1].Note) {
			t.Fatalf("checkpoint without growth: %v", err)
		}
		roots := refRoots(entries)
		for i, e := range entries {
			if e.Index != uint64(i) {
				t.Fatalf("entry %d has index %d", i, e.Index)
			}
		}
		for k, cp := range cps {
			parsed, err := ParseCheckpoint(cp.Note, lg.PublicKeys().VerifierKey)
			if err != nil || parsed.Size != cp.Size || parsed.Root != cp.Root || parsed.Origin != "test.fleetlearn/audit" {
				t.Fatalf("checkpoint %d: %+v, %v", k, parsed, err)
			}
			if cp.Root != roots[cp.Size] {
				t.Fatalf("checkpoint %d root differs from the reference", k)
			}
			for _, i := range []uint64{0, cp.Size / 2, cp.Size - 1} {
				proof, err := lg.InclusionProof(ctx, i, cp.Size)
				if err != nil {
					t.Fatal(err)
				}
				leaf := entries[i].LeafHash()
				if err := VerifyInclusion(i, cp.Size, leaf[:], proof, cp.Root[:]); err != nil {
					t.Fatalf("inclusion %d in %d: %v", i, cp.Size, err)
				}
			}
			if k > 0 {
				proof, err := lg.ConsistencyProof(ctx, cps[k-1].Size, cp.Size)
				if err != nil {
					t.Fatal(err)
				}
				if err := VerifyConsistency(cps[k-1].Size, cp.Size, proof, cps[k-1].Root[:], cp.Root[:]); err != nil {
					t.Fatalf("consistency %d→%d: %v", cps[k-1].Size, cp.Size, err)
				}
			}
		}
		for i, e := range entries {
			got, err := lg.Entry(ctx, uint64(i))
			if err != nil || !bytes.Equal(got.Data, e.Data) {
				t.Fatalf("Entry(%d): %v", i, err)
			}
			ev, err := VerifyEntry(got, lg.PublicKeys().Entry)
			if err != nil {
				t.Fatalf("VerifyEntry(%d): %v", i, err)
			}
			w := want[i]
			if ev.Type != w.Type || ev.Actor != w.Actor || ev.Subject != w.Subject || !bytes.Equal(ev.Payload, w.Payload) {
				t.Fatalf("entry %d: event %+v, want %+v", i, ev, w)
			}
		}
		n := uint64(0)
		for e, err := range lg.Entries(ctx, 10, 1<<40) {
			if err != nil {
				t.Fatal(err)
			}
			if e.Index != 10+n || !bytes.Equal(e.Data, entries[e.Index].Data) {
				t.Fatalf("Entries yielded %d at position %d", e.Index, n)
			}
			n++
		}
		if n != uint64(len(entries))-10 {
			t.Fatalf("Entries yielded %d", n)
		}
		// Out-of-range requests.
		size := lg.Size()
		for _, tc := range []struct {
			name string
			err  error
			want error
		}{
			{"inclusion beyond size", errOf(lg.InclusionProof(ctx, 0, size+1)), ErrNotFound},
			{"inclusion index = size", errOf(lg.InclusionProof(ctx, size, size)), ErrIndexRange},
			{"consistency from 0", errOf(lg.ConsistencyProof(ctx, 0, size)), ErrTreeSize},
			{"consistency backwards", errOf(lg.ConsistencyProof(ctx, 5, 4)), ErrTreeSize},
			{"consistency beyond", errOf(lg.ConsistencyProof(ctx, 1, size+1)), ErrNotFound},
			{"entry beyond", errOf(lg.Entry(ctx, size)), ErrNotFound},
			{"root beyond", errOf(lg.RootAt(ctx, size+1)), ErrNotFound},
		} {
			if !errors.Is(tc.err, tc.want) {
				t.Errorf("%s: %v, want %v", tc.name, tc.err, tc.want)
			}
		}
	})
}

func errOf[T any](_ T, err error) error { return err }

// TestSweep proves every entry of every tree size up to 300 and every
// consistency up to 100 from the SQLite store, and that a flipped bit in any
// proof hash is rejected.
func TestSweep(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		lg, _, _ := openTest(t)
		entries := appendN(t, lg, 300)
		roots := refRoots(entries)
		for n := uint64(1); n <= 300; n++ {
			if r, err := lg.RootAt(ctx, n); err != nil || r != roots[n] {
				t.Fatalf("RootAt(%d): %v", n, err)
			}
		}
		flip := 0
		for n := uint64(1); n <= 300; n++ {
			for i := uint64(0); i < n; i++ {
				proof, err := lg.InclusionProof(ctx, i, n)
				if err != nil {
					t.Fatal(err)
				}
				leaf := entries[i].LeafHash()
				if err := VerifyInclusion(i, n, leaf[:], proof, roots[n][:]); err != nil {
					t.Fatalf("inclusion (%d, %d): %v", i, n, err)
				}
				for j := range proof {
					bit := flip % 256
					flip++
					proof[j][bit/8] ^= 1 << (bit % 8)
					if err := VerifyInclusion(i, n, leaf[:], proof, roots[n][:]); !errors.Is(err, ErrRootMismatch) {
						t.Fatalf("inclusion (%d, %d), proof[%d] bit %d flipped: %v", i, n, j, bit, err)
					}
					proof[j][bit/8] ^= 1 << (bit % 8)
				}
			}
		}
		for n := uint64(1); n <= 100; n++ {
			for m := uint64(1); m <= n; m++ {
				proof, err := lg.ConsistencyProof(ctx, m, n)
				if err != nil {
					t.Fatal(err)
				}
				if err := VerifyConsistency(m, n, proof, roots[m][:], roots[n][:]); err != nil {
					t.Fatalf("consistency (%d, %d): %v", m, n, err)
				}
				for j := range proof {
					for bit := 0; bit < 256; bit += 37 {
						proof[j][bit/8] ^= 1 << (bit % 8)
						if err := VerifyConsistency(m, n, proof, roots[m][:], roots[n][:]); !errors.Is(err, ErrRootMismatch) {
							t.Fatalf("consistency (%d, %d), proof[%d] bit %d flipped: %v", m, n, j, bit, err)
						}
						proof[j][bit/8] ^= 1 << (bit % 8)
					}
				}
			}
		}
	})
}

func TestGroupCommitConcurrent(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		lg, _, _ := openTest(t, WithMaxBatch(64))
		const writers, each = 8, 40
		var wg sync.WaitGroup
		got := make([][]Entry, writers)
		errs := make([]error, writers)
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range each {
					if i%10 == 9 {
						es, err := lg.AppendBatch(ctx, []Event{sampleEvent(t, i), sampleEvent(t, i+1), sampleEvent(t, i+2)})
						if err != nil {
							errs[w] = err
							return
						}
						if es[1].Index != es[0].Index+1 || es[2].Index != es[0].Index+2 {
							errs[w] = errors.New("batch not contiguous")
							return
						}
						got[w] = append(got[w], es...)
						continue
					}
					e, err := lg.Append(ctx, sampleEvent(t, i))
					if err != nil {
						errs[w] = err
						return
					}
					got[w] = append(got[w], e)
				}
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		seen := map[uint64]bool{}
		for _, es := range got {
			for _, e := range es {
				if seen[e.Index] {
					t.Fatalf("index %d handed out twice", e.Index)
				}
				seen[e.Index] = true
				stored, err := lg.Entry(ctx, e.Index)
				if err != nil || !bytes.Equal(stored.Data, e.Data) {
					t.Fatalf("entry %d: %v", e.Index, err)
				}
			}
		}
		if want := uint64(writers * (each + 2*(each/10))); lg.Size() != want || uint64(len(seen)) != want {
			t.Fatalf("size %d, %d distinct, want %d", lg.Size(), len(seen), want)
		}
		// Times never go backwards along the log.
		var last time.Time
		for e, err := range lg.Entries(ctx, 0, lg.Size()) {
			if err != nil {
				t.Fatal(err)
			}
			ev, err := e.Event()
			if err != nil {
				t.Fatal(err)
			}
			if ev.Time.Before(last) {
				t.Fatalf("entry %d time goes back", e.Index)
			}
			last = ev.Time
		}
	})
}

func TestClockGoingBack(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		lg, _, clk := openTest(t)
		e1, err := lg.Append(ctx, sampleEvent(t, 0))
		if err != nil {
			t.Fatal(err)
		}
		clk.Set(t0.Add(-time.Hour))
		e2, err := lg.Append(ctx, sampleEvent(t, 1))
		if err != nil {
			t.Fatal(err)
		}
		ev1, _ := e1.Event()
		ev2, _ := e2.Event()
		if !ev2.Time.Equal(ev1.Time) {
			t.Fatalf("time after a clock step back: %v, want %v", ev2.Time, ev1.Time)
		}
	})
}

func TestAppendRejects(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		lg, _, _ := openTest(t, WithMaxBatch(4))
		good := sampleEvent(t, 0)
		for _, tc := range []struct {
			name string
			ev   Event
			want error
		}{
			{"raw device id", Event{Actor: Device("dev-017"), Type: TypeTaskStopped}, ErrNotPseudonym},
			{"no actor kind", Event{Actor: Actor{ID: "x"}, Type: TypeTaskStopped}, ErrInvalidEvent},
			{"empty operator", Event{Actor: Operator(""), Type: TypeTaskStopped}, ErrInvalidEvent},
			{"control char", Event{Actor: Operator("a\nb"), Type: TypeTaskStopped}, ErrInvalidEvent},
			{"bad type", Event{Actor: Operator("a"), Type: "Task Created"}, ErrInvalidEvent},
			{"bad model", Event{Actor: Operator("a"), Type: TypeTaskStopped, Subject: Subject{Model: "v1"}}, ErrInvalidEvent},
			{"payload not canonical", Event{Actor: Operator("a"), Type: TypeTaskStopped, Payload: []byte(`{ "a": 1 }`)}, ErrNotCanonical},
			{"payload not object", Event{Actor: Operator("a"), Type: TypeTaskStopped, Payload: []byte(`[1]`)}, ErrInvalidEvent},
			{"payload too large", Event{Actor: Operator("a"), Type: TypeTaskStopped, Payload: append(append([]byte(`{"a":"`), bytes.Repeat([]byte("x"), MaxPayloadBytes)...), `"}`...)}, ErrTooLarge},
		} {
			if _, err := lg.Append(ctx, tc.ev); !errors.Is(err, tc.want) {
				t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
			}
		}
		if _, err := lg.AppendBatch(ctx, []Event{good, good, good, good, good}); !errors.Is(err, ErrTooLarge) {
			t.Errorf("oversized batch: %v", err)
		}
		if _, err := lg.AppendBatch(ctx, []Event{good, {Actor: Device("raw")}}); !errors.Is(err, ErrNotPseudonym) {
			t.Errorf("batch with a bad event: %v", err)
		}
		if lg.Size() != 0 {
			t.Fatalf("rejected events were written: size %d", lg.Size())
		}
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := lg.Append(cctx, good); !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled append: %v", err)
		}
		if err := lg.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := lg.Append(ctx, good); !errors.Is(err, ErrClosed) {
			t.Errorf("append after close: %v", err)
		}
		if _, err := lg.Checkpoint(ctx); !errors.Is(err, ErrClosed) {
			t.Errorf("checkpoint after close: %v", err)
		}
		if _, err := lg.Query(ctx, Filter{}, 0, ""); !errors.Is(err, ErrClosed) {
			t.Errorf("query after close: %v", err)
		}
	})
}

// TestCommitFailureRecovers makes a commit fail (a row in the way of the
// next index): the appends fail, none is skipped, and once the obstacle is
// gone appends continue at the same index.
func TestCommitFailureRecovers(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		lg, dir, _ := openTest(t)
		appendN(t, lg, 5)
		db := rawDB(t, dir)
		mustExec(t, db, "INSERT INTO entries(idx, data, ts, type, actor_kind, actor, task, round) VALUES (5, ?, 0, 'x.y', 'service', 's', '', 0)", []byte{0})
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := lg.Append(ctx, sampleEvent(t, 1)); err == nil {
					t.Error("append over an occupied index succeeded")
				}
			}()
		}
		wg.Wait()
		if lg.Size() != 5 {
			t.Fatalf("size %d after failed commits", lg.Size())
		}
		mustExec(t, db, "DELETE FROM entries WHERE idx = 5")
		for i := range 3 {
			e, err := lg.Append(ctx, sampleEvent(t, i))
			if err != nil {
				t.Fatal(err)
			}
			if e.Index != uint64(5+i) {
				t.Fatalf("append %d got index %d", i, e.Index)
			}
		}
		if _, err := VerifyExport(bytes.NewReader(exportBytes(t, lg))); err != nil {
			t.Fatal(err)
		}
	})
}

func TestReopenAndKeys(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		lg, dir, clk := openTest(t)
		entries := appendN(t, lg, 25)
		cp1, err := lg.Checkpoint(ctx)
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, appendN(t, lg, 3)...)
		if err := lg.Close(); err != nil { // signs a final checkpoint
			t.Fatal(err)
		}
		st, err := os.Stat(filepath.Join(dir, KeysFile))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("keys file: %v, %v", st, err)
		}
		store := storeOpts(dir)
		lg2, err := Open(ctx, dir, append(store, WithClock(clk.Now))...)
		if err != nil {
			t.Fatal(err)
		}
		defer lg2.Close()
		// On PostgreSQL a second writer deposes the first instead (see
		// fence_test.go).
		if !onPostgres(t) {
			if _, err := Open(ctx, dir); !errors.Is(err, ErrLocked) {
				t.Errorf("second writer: %v", err)
			}
		}
		if ro, err := OpenReadOnly(ctx, storeTarget(dir)); err != nil {
			t.Errorf("reader next to a writer: %v", err)
		} else {
			ro.Close()
		}
		if lg2.Size() != 28 || lg2.Origin() != "test.fleetlearn/audit" {
			t.Fatalf("reopened: size %d origin %q", lg2.Size(), lg2.Origin())
		}
		latest, err := lg2.Latest(ctx)
		if err != nil || latest.Size != 28 {
			t.Fatalf("Close did not sign a final checkpoint: %+v, %v", latest, err)
		}
		entries = append(entries, appendN(t, lg2, 4)...)
		cp3, err := lg2.Checkpoint(ctx)
		if err != nil || cp3.Root != refRoots(entries)[32] {
			t.Fatalf("checkpoint after reopen: %v", err)
		}
		proof, _ := lg2.ConsistencyProof(ctx, cp1.Size, cp3.Size)
		if err := VerifyConsistency(cp1.Size, cp3.Size, proof, cp1.Root[:], cp3.Root[:]); err != nil {
			t.Fatal(err)
		}
		lg2.Close()

		// Other keys, another origin, a lost keys file.
		if _, err := Open(ctx, dir, append(store, WithKeys(testKeys(t, 9)))...); !errors.Is(err, ErrKeyMismatch) {
			t.Errorf("other keys: %v", err)
		}
		if _, err := Open(ctx, dir, append(store, WithOrigin("elsewhere"))...); !errors.Is(err, ErrKeyMismatch) {
			t.Errorf("other origin: %v", err)
		}
		keys, _ := os.ReadFile(filepath.Join(dir, KeysFile))
		os.Remove(filepath.Join(dir, KeysFile))
		if _, err := Open(ctx, dir, store...); !errors.Is(err, ErrInvalidKeys) {
			t.Errorf("missing keys file: %v", err)
		}
		if _, err := os.Stat(filepath.Join(dir, KeysFile)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a keys file was made for a log that has keys: %v", err)
		}
		k, err := ParseKeys(keys)
		if err != nil {
			t.Fatal(err)
		}
		lg3, err := Open(ctx, dir, append(store, WithKeys(k))...)
		if err != nil {
			t.Fatalf("keys given directly: %v", err)
		}
		if lg3.Size() != 32 {
			t.Fatalf("size %d with keys given directly", lg3.Size())
		}
		lg3.Close()
	})
}

func TestKeysFormat(t *testing.T) {
	k := testKeys(t, 3)
	text, err := k.MarshalText()
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseKeys(text)
	if err != nil || !back.Entry.Equal(k.Entry) || !back.Checkpoint.Equal(k.Checkpoint) || !bytes.Equal(back.Pseudonym, k.Pseudonym) {
		t.Fatalf("round trip: %v", err)
	}
	same := k
	same.Checkpoint = k.Entry
	for name, b := range map[string][]byte{
		"empty":       nil,
		"bad header":  bytes.Replace(text, []byte("v1"), []byte("v2"), 1),
		"short seed":  bytes.Replace(text, []byte("entry-ed25519-seed: "), []byte("entry-ed25519-seed: AAAA"), 1),
		"extra line":  append(bytes.Clone(text), "x\n"...),
		"huge":        bytes.Repeat([]byte("a"), 5000),
		"not base64":  bytes.Replace(text, []byte("pseudonym-hmac-key: "), []byte("pseudonym-hmac-key: !"), 1),
		"field order": bytes.Replace(bytes.Replace(text, []byte("entry-"), []byte("tmp-"), 1), []byte("checkpoint-"), []byte("entry-"), 1),
	} {
		if _, err := ParseKeys(b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := same.MarshalText(); !errors.Is(err, ErrInvalidKeys) {
		t.Errorf("equal entry and checkpoint keys: %v", err)
	}
	if _, err := GenerateKeys(bytes.NewReader(nil)); err == nil {
		t.Error("GenerateKeys from an empty reader")
	}
}

func TestReadOnly(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		lg, dir, _ := openTest(t)
		appendN(t, lg, 12)
		if err := lg.Close(); err != nil {
			t.Fatal(err)
		}
		var before []byte
		// The log is named by its folder or file, or its database's URL
		// given as either argument.
		targets := []struct {
			path string
			opts []Option
		}{{dir, nil}, {filepath.Join(dir, DBFile), nil}}
		if onPostgres(t) {
			targets = []struct {
				path string
				opts []Option
			}{{storeTarget(dir), nil}, {"", storeOpts(dir)}}
		} else {
			var err error
			if before, err = os.ReadFile(filepath.Join(dir, DBFile)); err != nil {
				t.Fatal(err)
			}
		}
		for _, target := range targets {
			ro, err := OpenReadOnly(ctx, target.path, target.opts...)
			if err != nil {
				t.Fatal(err)
			}
			if ro.Size() != 12 {
				t.Fatalf("read-only size %d", ro.Size())
			}
			cp, err := ro.Latest(ctx)
			if err != nil || cp.Size != 12 {
				t.Fatalf("read-only latest: %+v, %v", cp, err)
			}
			proof, err := ro.InclusionProof(ctx, 3, 12)
			if err != nil {
				t.Fatal(err)
			}
			e, _ := ro.Entry(ctx, 3)
			leaf := e.LeafHash()
			if err := VerifyInclusion(3, 12, leaf[:], proof, cp.Root[:]); err != nil {
				t.Fatal(err)
			}
			if _, err := ro.Append(ctx, sampleEvent(t, 0)); !errors.Is(err, ErrReadOnly) {
				t.Errorf("append: %v", err)
			}
			if _, err := ro.Checkpoint(ctx); !errors.Is(err, ErrReadOnly) {
				t.Errorf("checkpoint: %v", err)
			}
			if _, err := ro.PseudonymizeDevice("d"); !errors.Is(err, ErrReadOnly) {
				t.Errorf("pseudonymize: %v", err)
			}
			if _, err := VerifyExport(bytes.NewReader(exportBytes(t, ro))); err != nil {
				t.Fatal(err)
			}
			// Its connections refuse to write, whatever the statement.
			if _, err := ro.rdb.ExecContext(ctx, "DELETE FROM entries WHERE idx = 3"); err == nil {
				t.Error("a read-only log's connection deleted an entry")
			}
			if err := ro.Close(); err != nil {
				t.Fatal(err)
			}
		}
		if onPostgres(t) {
			if size := rawSize(t, dir); size != 12 {
				t.Fatalf("%d entries after the read-only opens", size)
			}
			if _, err := OpenReadOnly(ctx, "", WithDatabase("/tmp/not-a-url")); !errors.Is(err, ErrInvalidDatabase) {
				t.Fatalf("OpenReadOnly of a path given as a database: %v", err)
			}
			return
		}
		after, _ := os.ReadFile(filepath.Join(dir, DBFile))
		if !bytes.Equal(before, after) {
			t.Fatal("OpenReadOnly changed the database file")
		}
		if _, err := OpenReadOnly(ctx, filepath.Join(dir, "nope")); err == nil {
			t.Fatal("OpenReadOnly of a missing path")
		}
	})
}

func TestPseudonyms(t *testing.T) {
	lg, _, _ := openTest(t)
	p1, err := lg.PseudonymizeDevice("device-0001")
	if err != nil {
		t.Fatal(err)
	}
	p2, _ := lg.PseudonymizeDevice("device-0001")
	p3, _ := lg.PseudonymizeDevice("device-0002")
	other := PseudonymizeDevice(testKeys(t, 7).Pseudonym, "device-0001")
	if p1 != p2 || p1 == p3 || p1 == other || !isPseudonym(p1) || len(p1) != 67 {
		t.Fatalf("pseudonyms %s %s %s %s", p1, p2, p3, other)
	}
	if bytes.Contains([]byte(p1), []byte("0001")) {
		t.Fatal("pseudonym shows the raw id")
	}
	if _, err := lg.Record(context.Background(), Device(p1), DeviceRevoked{Device: p1, Reason: "lost"}); err != nil {
		t.Fatal(err)
	}
	if _, err := NewEvent(Operator("a"), DeviceRevoked{Device: "device-0001"}); !errors.Is(err, ErrNotPseudonym) {
		t.Fatalf("raw id in a payload: %v", err)
	}
}

// TestCheckpointRefusesInconsistentTree alters a stored subtree that the
// consistency proof from the last checkpoint relies on: the log must refuse
// to sign, and refuse to open.
func TestCheckpointRefusesInconsistentTree(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		lg, dir, clk := openTest(t)
		appendN(t, lg, 6)
		if _, err := lg.Checkpoint(ctx); err != nil {
			t.Fatal(err)
		}
		appendN(t, lg, 5)
		// The proof from 6 to 11 uses the subtree over entries [4, 6): level 1, index 2.
		db := rawDB(t, dir)
		mustExec(t, db, "UPDATE nodes SET hash = ? WHERE id = ?", make([]byte, 32), nodeKey(merkle.NodeID{Level: 1, Index: 2}))
		if _, err := lg.Checkpoint(ctx); !errors.Is(err, ErrInconsistent) {
			t.Fatalf("checkpoint over a changed tree: %v", err)
		}
		lg.Close()
		db.Close()
		if _, err := Open(ctx, dir, append(storeOpts(dir), WithClock(clk.Now))...); !errors.Is(err, ErrInconsistent) {
			t.Fatalf("open over a changed tree: %v", err)
		}
	})
}

func TestOpenRefusesDamage(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		for name, damage := range map[string]func(t *testing.T, lg *Log, db *sqldb.DB){
			"missing row": func(t *testing.T, _ *Log, db *sqldb.DB) { mustExec(t, db, "DELETE FROM entries WHERE idx = 3") },
			"truncated":   func(t *testing.T, _ *Log, db *sqldb.DB) { mustExec(t, db, "DELETE FROM entries WHERE idx >= 8") },
			"missing node": func(t *testing.T, _ *Log, db *sqldb.DB) {
				mustExec(t, db, "DELETE FROM nodes WHERE id = ?", nodeKey(merkle.NodeID{Level: 3, Index: 0}))
			},
			"wrong format": func(t *testing.T, _ *Log, db *sqldb.DB) {
				mustExec(t, db, "UPDATE meta SET value = 'other' WHERE key = 'format'")
			},
			"forged checkpoint": func(t *testing.T, lg *Log, db *sqldb.DB) {
				cp, err := lg.Latest(ctx)
				if err != nil {
					t.Fatal(err)
				}
				forged := bytes.Replace(cp.Note, []byte("\n10\n"), []byte("\n9\n"), 1)
				if bytes.Equal(forged, cp.Note) {
					t.Fatal("no size line to change")
				}
				mustExec(t, db, "UPDATE checkpoints SET note = ? WHERE size = 10", forged)
			},
		} {
			t.Run(name, func(t *testing.T) {
				lg, dir, _ := openTest(t)
				appendN(t, lg, 10)
				if _, err := lg.Checkpoint(ctx); err != nil {
					t.Fatal(err)
				}
				db := rawDB(t, dir)
				damage(t, lg, db)
				db.Close()
				lg.Close()
				if lg, err := Open(ctx, dir, storeOpts(dir)...); err == nil {
					lg.Close()
					t.Fatal("opened a damaged log")
				}
			})
		}
	})
}

// TestLargeBatch writes a batch whose entry rows alone would bind more
// parameters than one PostgreSQL statement takes (65,535; 8 per row): the
// inserts are statements of at most 512 rows in the batch's transaction.
func TestLargeBatch(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		const n = 65535/8 + 9 // 65,600 parameters in one statement
		lg, dir, clk := openTest(t, WithMaxBatch(n))
		evs := make([]Event, n)
		for i := range evs {
			evs[i] = sampleEvent(t, i)
		}
		es, err := lg.AppendBatch(ctx, evs)
		if err != nil {
			t.Fatal(err)
		}
		if len(es) != n || es[n-1].Index != n-1 || lg.Size() != n || rawSize(t, dir) != n {
			t.Fatalf("%d entries acknowledged, size %d, %d rows", len(es), lg.Size(), rawSize(t, dir))
		}
		cp, err := lg.Checkpoint(ctx)
		if err != nil || cp.Root != refRoots(es)[n] {
			t.Fatalf("checkpoint of the batch: %v", err)
		}
		rep, err := VerifyExport(bytes.NewReader(exportBytes(t, lg, WithProofs())))
		if err != nil || rep.Entries != n || rep.Proofs != n {
			t.Fatalf("export: %+v, %v", rep, err)
		}
		if err := lg.Close(); err != nil {
			t.Fatal(err)
		}
		lg, err = Open(ctx, dir, append(storeOpts(dir), WithClock(clk.Now))...)
		if err != nil {
			t.Fatal(err)
		}
		defer lg.Close()
		if r, err := lg.RootAt(ctx, n); err != nil || r != cp.Root {
			t.Fatalf("reopened: root %x, %v", r, err)
		}
	})
}
