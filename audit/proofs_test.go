package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/fleetlearn/fleetlearn/internal/sqldb"
)

// proofLog builds a log with checkpoints at sizes 5, 12, 13 and 32 and
// returns it, its entries and the checkpoints.
func proofLog(t *testing.T) (*Log, string, []Entry, []Checkpoint) {
	t.Helper()
	lg, dir, _ := openTest(t)
	var entries []Entry
	var cps []Checkpoint
	for _, n := range []int{5, 7, 1, 19} {
		entries = append(entries, appendN(t, lg, n)...)
		cp, err := lg.Checkpoint(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		cps = append(cps, cp)
	}
	return lg, dir, entries, cps
}

// exportLines splits an export into its records.
func exportLines(t *testing.T, exp []byte) []map[string]json.RawMessage {
	t.Helper()
	var out []map[string]json.RawMessage
	for _, l := range bytes.Split(bytes.TrimSuffix(exp, []byte("\n")), []byte("\n")) {
		var rec map[string]json.RawMessage
		if err := json.Unmarshal(l, &rec); err != nil {
			t.Fatalf("%s: %v", l, err)
		}
		out = append(out, rec)
	}
	return out
}

func TestExportWithProofs(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		lg, _, entries, cps := proofLog(t)
		exp := exportBytes(t, lg, WithProofs())
		recs := exportLines(t, exp)
		if len(recs) != 1+len(cps)+len(entries)+1 {
			t.Fatalf("%d records", len(recs))
		}
		// An auditor with RFC 9162 alone checks each proof against roots it
		// computes from the entries.
		roots := refRoots(entries)
		latest := cps[len(cps)-1].Size
		for k, cp := range cps {
			rec := recs[1+k]
			if string(rec["kind"]) != `"checkpoint"` {
				t.Fatalf("record %d: %s", 1+k, rec["kind"])
			}
			raw, ok := rec["consistency"]
			if k == 0 {
				if ok {
					t.Errorf("the first checkpoint carries a consistency proof: %s", raw)
				}
				continue
			}
			var p struct {
				FromSize *uint64  `json:"from_size"`
				Proof    []string `json:"proof"`
			}
			if err := json.Unmarshal(raw, &p); err != nil || p.FromSize == nil {
				t.Fatalf("checkpoint %d: consistency %s: %v", k, raw, err)
			}
			if *p.FromSize != cps[k-1].Size {
				t.Errorf("checkpoint %d: consistency from %d, want %d", k, *p.FromSize, cps[k-1].Size)
			}
			proof, err := DecodeProof(p.Proof)
			if err != nil {
				t.Fatal(err)
			}
			if err := VerifyConsistency(*p.FromSize, cp.Size, proof, roots[*p.FromSize][:], roots[cp.Size][:]); err != nil {
				t.Errorf("checkpoint %d: %v", k, err)
			}
		}
		for i, e := range entries {
			rec := recs[1+len(cps)+i]
			var p struct {
				TreeSize *uint64  `json:"tree_size"`
				Proof    []string `json:"proof"`
			}
			if err := json.Unmarshal(rec["inclusion"], &p); err != nil || p.TreeSize == nil {
				t.Fatalf("entry %d: inclusion %s: %v", i, rec["inclusion"], err)
			}
			if *p.TreeSize != latest {
				t.Errorf("entry %d: inclusion in size %d, want %d", i, *p.TreeSize, latest)
			}
			proof, err := DecodeProof(p.Proof)
			if err != nil {
				t.Fatal(err)
			}
			leaf := e.LeafHash()
			if err := VerifyInclusion(uint64(i), latest, leaf[:], proof, roots[latest][:]); err != nil {
				t.Errorf("entry %d: %v", i, err)
			}
		}
		rep, err := VerifyExport(bytes.NewReader(exp))
		if err != nil {
			t.Fatal(err)
		}
		if want := len(entries) + len(cps) - 1; rep.Proofs != want || rep.Checkpoints != len(cps) || rep.Entries != uint64(len(entries)) {
			t.Fatalf("report: %d proofs (want %d), %d checkpoints, %d entries", rep.Proofs, want, rep.Checkpoints, rep.Entries)
		}
		// Without WithProofs there are none; with only the latest checkpoint,
		// no consistency proofs.
		if rep, err := VerifyExport(bytes.NewReader(exportBytes(t, lg))); err != nil || rep.Proofs != 0 {
			t.Errorf("no proofs: %d, %v", rep.Proofs, err)
		}
		if rep, err := VerifyExport(bytes.NewReader(exportBytes(t, lg, WithProofs(), WithLatestCheckpointOnly()))); err != nil || rep.Proofs != len(entries) {
			t.Errorf("latest only: %d proofs, %v", rep.Proofs, err)
		}
	})
}

// A checkpoint after an empty-tree checkpoint carries no consistency
// proof: every tree extends the empty one.
func TestExportProofsAfterEmptyCheckpoint(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		lg, _, _ := openTest(t)
		for _, n := range []int{0, 3, 5} {
			appendN(t, lg, n)
			if _, err := lg.Checkpoint(ctx); err != nil {
				t.Fatal(err)
			}
		}
		exp := exportBytes(t, lg, WithProofs())
		recs := exportLines(t, exp)
		for k, want := range []string{"", "", `{"from_size":3,`} {
			got := string(recs[1+k]["consistency"])
			if !strings.HasPrefix(got, want) || (want == "") != (got == "") {
				t.Errorf("checkpoint %d: consistency %q, want %q...", k, got, want)
			}
		}
		rep, err := VerifyExport(bytes.NewReader(exp))
		if err != nil || rep.Proofs != 8+1 || rep.Checkpoints != 3 {
			t.Fatalf("%d proofs, %d checkpoints, %v", rep.Proofs, rep.Checkpoints, err)
		}
	})
}

// A read-only export of a log whose last entries no checkpoint covers:
// only covered entries carry a proof.
func TestExportProofsUncoveredTail(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		lg, dir, entries, cps := proofLog(t)
		if err := lg.Close(); err != nil {
			t.Fatal(err)
		}
		// Forget the latest checkpoint, as if the server died before signing it.
		tamper(t, dir, func(db *sqldb.DB) {
			mustExec(t, db, "DELETE FROM checkpoints WHERE size = ?", int64(cps[len(cps)-1].Size))
		})
		exp := exportReadOnly(t, dir, WithProofs())
		covered := cps[len(cps)-2].Size
		for i, rec := range exportLines(t, exp)[len(cps):][:len(entries)] {
			if _, ok := rec["inclusion"]; ok != (uint64(i) < covered) {
				t.Errorf("entry %d of %d covered: inclusion proof %v", i, covered, ok)
			}
		}
		rep, err := VerifyExport(bytes.NewReader(exp), WithUncoveredTail())
		if err != nil {
			t.Fatal(err)
		}
		if want := int(covered) + len(cps) - 2; rep.Proofs != want || rep.Uncovered != uint64(len(entries))-covered {
			t.Fatalf("%d proofs (want %d), %d uncovered", rep.Proofs, want, rep.Uncovered)
		}
	})
}

// Each inline proof is checked against the signed roots: a changed hash,
// a tree size no checkpoint signs or a proof from the wrong checkpoint
// fails where it is.
func TestInlineProofsTampered(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		lg, _, entries, cps := proofLog(t)
		exp := exportBytes(t, lg, WithProofs())
		lines := strings.Split(strings.TrimSuffix(string(exp), "\n"), "\n")
		entryLine := func(i int) int { return 1 + len(cps) + i }
		cpLine := func(k int) int { return 1 + k }
		// flip changes the first hex digit after marker on line n.
		flip := func(n int, marker string) func([]string) {
			return func(ls []string) {
				i := strings.Index(ls[n], marker)
				if i < 0 {
					t.Fatalf("no %s on line %d: %s", marker, n, ls[n])
				}
				i += len(marker)
				d := "0"
				if ls[n][i] == '0' {
					d = "1"
				}
				ls[n] = ls[n][:i] + d + ls[n][i+1:]
			}
		}
		replace := func(n int, old, new string) func([]string) {
			return func(ls []string) {
				if !strings.Contains(ls[n], old) {
					t.Fatalf("no %s on line %d: %s", old, n, ls[n])
				}
				ls[n] = strings.Replace(ls[n], old, new, 1)
			}
		}
		latest := fmt.Sprint(cps[len(cps)-1].Size)
		for _, tc := range []struct {
			name   string
			change func([]string)
			index  int64
			cp     int
			want   []error
		}{
			{"inclusion hash", flip(entryLine(9), `"inclusion":{"tree_size":`+latest+`,"proof":["`), 9, 3,
				[]error{ErrTampered, ErrInvalidProof, ErrRootMismatch}},
			{"last inclusion hash", flip(entryLine(len(entries)-1), `"proof":["`), int64(len(entries) - 1), 3,
				[]error{ErrTampered, ErrInvalidProof}},
			{"one-byte hash in an inclusion proof", replace(entryLine(9), `"proof":["`, `"proof":["00","`), 9, 3,
				[]error{ErrTampered, ErrInvalidProof, ErrHashSize}},
			{"consistency hash", flip(cpLine(2), `"consistency":{"from_size":12,"proof":["`), 12, 2,
				[]error{ErrTampered, ErrInvalidProof}},
			{"inclusion in an unsigned size", replace(entryLine(9), `"tree_size":`+latest, `"tree_size":31`), 9, -1,
				[]error{ErrExportFormat}},
			{"inclusion in an earlier checkpoint", replace(entryLine(9), `"tree_size":`+latest, `"tree_size":12`), 9, 1,
				[]error{ErrTampered, ErrInvalidProof}},
			{"inclusion beyond its checkpoint", replace(entryLine(20), `"tree_size":`+latest, `"tree_size":13`), 20, 2,
				[]error{ErrTampered, ErrInvalidProof, ErrIndexRange}},
			{"inclusion with from_size", replace(entryLine(9), `"tree_size":`, `"from_size":5,"tree_size":`), 9, -1,
				[]error{ErrExportFormat}},
			{"consistency from the wrong size", replace(cpLine(2), `"from_size":12`, `"from_size":5`), -1, 2,
				[]error{ErrExportFormat}},
			{"consistency with tree_size", replace(cpLine(2), `"from_size":12`, `"from_size":12,"tree_size":13`), -1, 2,
				[]error{ErrExportFormat}},
			{"consistency on the first checkpoint", replace(cpLine(0), `"}`, `","consistency":{"from_size":0,"proof":[]}}`), -1, 0,
				[]error{ErrExportFormat}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				ls := append([]string(nil), lines...)
				tc.change(ls)
				_, err := VerifyExport(strings.NewReader(strings.Join(ls, "\n") + "\n"))
				ve := wantVerifyError(t, err, tc.index, tc.want...)
				if ve.Checkpoint != tc.cp {
					t.Errorf("checkpoint %d, want %d", ve.Checkpoint, tc.cp)
				}
				for _, other := range []error{ErrTampered, ErrExportFormat} {
					if errors.Is(err, other) && !errors.Is(tc.want[0], other) {
						t.Errorf("%v also wraps %v", err, other)
					}
				}
			})
		}
		// Proofs are extras: without one the entry still verifies, uncounted.
		ls := append([]string(nil), lines...)
		i := strings.Index(ls[entryLine(9)], `,"inclusion":`)
		ls[entryLine(9)] = ls[entryLine(9)][:i] + "}"
		rep, err := VerifyExport(strings.NewReader(strings.Join(ls, "\n") + "\n"))
		if err != nil || rep.Proofs != len(entries)+len(cps)-2 {
			t.Fatalf("one proof removed: %d proofs, %v", rep.Proofs, err)
		}
	})
}

// assembleWithProofs writes the log's entries through an ExportWriter with
// the given checkpoints and leaf hashes.
func assembleWithProofs(t *testing.T, lg *Log, notes [][]byte, size uint64, leaves [][32]byte) ([]byte, error) {
	t.Helper()
	var buf bytes.Buffer
	x, err := NewExportWriter(&buf, lg.PublicKeys(), notes, size, WithLeafHashes(leaves))
	if err != nil {
		return nil, err
	}
	for e, err := range lg.Entries(context.Background(), 0, size) {
		if err != nil {
			t.Fatal(err)
		}
		h := e.LeafHash()
		if err := x.WriteEntry(e, h[:]); err != nil {
			if err2 := x.Close(); !errors.Is(err2, ErrExportFormat) {
				t.Errorf("close after a refused entry: %v", err2)
			}
			return nil, err
		}
	}
	if err := x.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// sameExport names the first line where two exports differ.
func sameExport(t *testing.T, got, want []byte) {
	t.Helper()
	if bytes.Equal(got, want) {
		return
	}
	g, w := bytes.Split(got, []byte("\n")), bytes.Split(want, []byte("\n"))
	for i := range min(len(g), len(w)) {
		if !bytes.Equal(g[i], w[i]) {
			t.Fatalf("assembled export differs at line %d:\n%s\nwant\n%s", i+1, g[i], w[i])
		}
	}
	t.Fatalf("assembled export has %d lines, want %d", len(g), len(w))
}

func TestExportWriterWithLeafHashes(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		lg, _, entries, cps := proofLog(t)
		leaves := make([][32]byte, len(entries))
		for i, e := range entries {
			leaves[i] = e.LeafHash()
		}
		latest := cps[len(cps)-1]
		got, err := assembleWithProofs(t, lg, [][]byte{latest.Note}, latest.Size, leaves)
		if err != nil {
			t.Fatal(err)
		}
		sameExport(t, got, exportBytes(t, lg, WithLatestCheckpointOnly(), WithProofs()))
		// With every checkpoint, the consistency proofs between them too.
		var notes [][]byte
		for _, cp := range cps {
			notes = append(notes, cp.Note)
		}
		all, err := assembleWithProofs(t, lg, notes, latest.Size, leaves)
		if err != nil {
			t.Fatal(err)
		}
		sameExport(t, all, exportBytes(t, lg, WithProofs()))
		rep, err := VerifyExport(bytes.NewReader(all))
		if err != nil || rep.Proofs != len(entries)+len(cps)-1 {
			t.Fatalf("%d proofs, %v", rep.Proofs, err)
		}

		// An entry that is not the one its leaf hash was taken from (the
		// source changed between the two passes) is refused.
		changed := append([][32]byte(nil), leaves...)
		changed[17][0] ^= 1
		if _, err := assembleWithProofs(t, lg, notes, latest.Size, changed); !errors.Is(err, ErrExportFormat) ||
			!strings.Contains(err.Error(), "entry 17") {
			t.Fatalf("changed entry: %v", err)
		}
		// Leaf hashes that do not fit the export.
		for name, tc := range map[string]struct {
			notes  [][]byte
			size   uint64
			leaves [][32]byte
			want   error
		}{
			"too few leaves":        {notes, latest.Size, leaves[:len(leaves)-1], ErrExportFormat},
			"no checkpoint":         {nil, latest.Size, leaves, ErrExportFormat},
			"checkpoint beyond":     {notes, cps[2].Size, leaves[:cps[2].Size], ErrExportFormat},
			"checkpoint not signed": {[][]byte{[]byte("not a note")}, latest.Size, leaves, ErrBadCheckpoint},
		} {
			if _, err := assembleWithProofs(t, lg, tc.notes, tc.size, tc.leaves); !errors.Is(err, tc.want) {
				t.Errorf("%s: %v, want %v", name, err, tc.want)
			}
		}
	})
}
