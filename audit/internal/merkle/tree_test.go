package merkle

import "testing"

func asBytes(hs []Hash) [][]byte {
	out := make([][]byte, len(hs))
	for i := range hs {
		out[i] = hs[i][:]
	}
	return out
}

// TestTreeMatchesRFC compares every proof of the in-memory tree with the
// RFC 6962 §2.1 reference definitions (PATH and PROOF) for all sizes up to
// 70.
func TestTreeMatchesRFC(t *testing.T) {
	_, leaves := newMemTree(70)
	tree := NewTree(leaves)
	for n := uint64(1); n <= tree.Size(); n++ {
		if got, want := tree.Root(n), refRoot(leaves[:n]); got != want {
			t.Fatalf("root %d differs", n)
		}
		for i := range n {
			p, ok := tree.InclusionProof(i, n)
			if !ok || !equalProofs(asBytes(p), refPath(i, leaves[:n])) {
				t.Fatalf("inclusion (%d, %d) differs from PATH", i, n)
			}
		}
		for m := uint64(1); m <= n; m++ {
			p, ok := tree.ConsistencyProof(m, n)
			if !ok || !equalProofs(asBytes(p), refProof(m, leaves[:n])) {
				t.Fatalf("consistency (%d, %d) differs from PROOF", m, n)
			}
		}
	}
	for _, c := range []struct{ a, b uint64 }{{0, 5}, {5, 4}, {3, 71}} {
		if _, ok := tree.ConsistencyProof(c.a, c.b); ok {
			t.Errorf("consistency (%d, %d) accepted", c.a, c.b)
		}
	}
	if _, ok := tree.InclusionProof(70, 70); ok {
		t.Error("inclusion of index = size accepted")
	}
	if _, ok := tree.InclusionProof(0, 71); ok {
		t.Error("inclusion beyond the tree accepted")
	}
}
