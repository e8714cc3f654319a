package merkle

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"testing"

	"github.com/fleetlearn/fleetlearn/audit/internal/testvectors"
)

// refRoot is MTH straight from RFC 6962 §2.1, recursively over leaf hashes.
func refRoot(leaves []Hash) Hash {
	switch len(leaves) {
	case 0:
		return EmptyRoot
	case 1:
		return leaves[0]
	}
	k := splitPoint(uint64(len(leaves)))
	return NodeHash(refRoot(leaves[:k]), refRoot(leaves[k:]))
}

// refPath is PATH(m, D[n]) from RFC 6962 §2.1.1.
func refPath(m uint64, leaves []Hash) [][]byte {
	n := uint64(len(leaves))
	if n <= 1 {
		return nil
	}
	k := splitPoint(n)
	if m < k {
		r := refRoot(leaves[k:])
		return append(refPath(m, leaves[:k]), r[:])
	}
	r := refRoot(leaves[:k])
	return append(refPath(m-k, leaves[k:]), r[:])
}

// refProof is PROOF(m, D[n]) from RFC 6962 §2.1.2.
func refProof(m uint64, leaves []Hash) [][]byte {
	var sub func(m uint64, d []Hash, b bool) [][]byte
	sub = func(m uint64, d []Hash, b bool) [][]byte {
		n := uint64(len(d))
		if m == n {
			if b {
				return nil
			}
			r := refRoot(d)
			return [][]byte{r[:]}
		}
		k := splitPoint(n)
		if m <= k {
			r := refRoot(d[k:])
			return append(sub(m, d[:k], b), r[:])
		}
		r := refRoot(d[:k])
		return append(sub(m-k, d[k:], false), r[:])
	}
	return sub(m, leaves, true)
}

// memTree keeps every complete subtree hash, as the SQLite store does.
type memTree struct {
	f     *Frontier
	nodes map[NodeID]Hash
}

func newMemTree(n int) (*memTree, []Hash) {
	t := &memTree{f: &Frontier{}, nodes: map[NodeID]Hash{}}
	leaves := make([]Hash, n)
	for i := range leaves {
		leaves[i] = LeafHash([]byte(fmt.Sprintf("entry %d", i)))
		t.f.Append(leaves[i], func(id NodeID, h Hash) { t.nodes[id] = h })
	}
	return t, leaves
}

func (t *memTree) rangeHash(r Range) Hash {
	var hs []Hash
	for _, id := range Cover(r.Begin, r.End) {
		h, ok := t.nodes[id]
		if !ok {
			panic(fmt.Sprintf("missing node %+v for %+v", id, r))
		}
		hs = append(hs, h)
	}
	return RangeHash(hs)
}

func (t *memTree) proof(rs []Range) [][]byte {
	out := make([][]byte, len(rs))
	for i, r := range rs {
		h := t.rangeHash(r)
		out[i] = h[:]
	}
	return out
}

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestHasherVectors(t *testing.T) {
	var v testvectors.RFC6962
	testvectors.Load(t, "rfc6962_vectors.json", &v)
	if len(v.HasherVectors) == 0 || len(v.Leaves) == 0 || len(v.Roots) == 0 || len(v.SubtreeHashes) == 0 {
		t.Fatal("vector file has empty tables")
	}
	for _, hv := range v.HasherVectors {
		var got Hash
		switch hv.Kind {
		case "empty_root":
			got = EmptyRoot
		case "leaf":
			got = LeafHash(hv.Input)
		case "node":
			// Raw, non-hash children: hash the concatenation as RFC 6962 does.
			got = nodeHashRaw(hv.Left, hv.Right)
		default:
			t.Fatalf("unknown hasher vector kind %q", hv.Kind)
		}
		if !bytes.Equal(got[:], hv.Want) {
			t.Errorf("%s: got %x, want %x", hv.Desc, got, []byte(hv.Want))
		}
	}
	var leaves []Hash
	for _, l := range v.Leaves {
		h := LeafHash(l.Input)
		if !bytes.Equal(h[:], l.LeafHash) {
			t.Errorf("leaf %d: got %x, want %x", l.Index, h, []byte(l.LeafHash))
		}
		leaves = append(leaves, h)
	}
	for _, r := range v.Roots {
		f := &Frontier{}
		for _, l := range leaves[:r.TreeSize] {
			f.Append(l, func(NodeID, Hash) {})
		}
		if got := f.Root(); !bytes.Equal(got[:], r.Root) {
			t.Errorf("root of %d leaves: got %x, want %x", r.TreeSize, got, []byte(r.Root))
		}
		if got := refRoot(leaves[:r.TreeSize]); !bytes.Equal(got[:], r.Root) {
			t.Errorf("reference root of %d leaves: got %x", r.TreeSize, got)
		}
	}
	tree, _ := newMemTree(0)
	for _, l := range leaves {
		tree.f.Append(l, func(id NodeID, h Hash) { tree.nodes[id] = h })
	}
	for _, s := range v.SubtreeHashes {
		got, ok := tree.nodes[NodeID{Level: s.Level, Index: s.Index}]
		if !ok || !bytes.Equal(got[:], s.Hash) {
			t.Errorf("subtree (%d,%d): got %x (stored %v), want %x", s.Level, s.Index, got, ok, []byte(s.Hash))
		}
		if uint64(1)<<s.Level*s.Index != s.Start || uint64(1)<<s.Level*(s.Index+1) != s.End {
			t.Errorf("subtree (%d,%d) covers [%d,%d)", s.Level, s.Index, s.Start, s.End)
		}
	}
	for _, p := range v.InclusionProofs {
		if got := LeafHash(p.LeafInput); !bytes.Equal(got[:], p.LeafHash) {
			t.Errorf("inclusion vector leaf hash mismatch at %d", p.LeafIndex)
		}
		if err := VerifyInclusion(p.LeafIndex, p.TreeSize, p.LeafHash, testvectors.Bytes(p.Proof), p.Root); err != nil {
			t.Errorf("inclusion (%d, %d): %v", p.LeafIndex, p.TreeSize, err)
		}
		if got := tree.proof(InclusionRanges(p.LeafIndex, p.TreeSize)); !equalProofs(got, testvectors.Bytes(p.Proof)) {
			t.Errorf("inclusion (%d, %d): generated proof differs from the vector", p.LeafIndex, p.TreeSize)
		}
	}
	for _, p := range v.ConsistencyProofs {
		if err := VerifyConsistency(p.Size1, p.Size2, testvectors.Bytes(p.Proof), p.Root1, p.Root2); err != nil {
			t.Errorf("consistency (%d, %d): %v", p.Size1, p.Size2, err)
		}
		if got := tree.proof(ConsistencyRanges(p.Size1, p.Size2)); !equalProofs(got, testvectors.Bytes(p.Proof)) {
			t.Errorf("consistency (%d, %d): generated proof differs from the vector", p.Size1, p.Size2)
		}
	}
}

func nodeHashRaw(l, r []byte) Hash {
	return sha256.Sum256(append(append([]byte{1}, l...), r...))
}

func equalProofs(a, b [][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

func TestProbes(t *testing.T) {
	var p testvectors.Probes
	testvectors.Load(t, "rfc6962_probes.json", &p)
	accepted, rejected := 0, 0
	for _, c := range p.Inclusion {
		err := VerifyInclusion(c.LeafIndex, c.TreeSize, c.LeafHash, testvectors.Bytes(c.Proof), c.Root)
		if (err == nil) != c.WantValid {
			t.Errorf("%s: valid=%v, want %v (err %v)", c.File, err == nil, c.WantValid, err)
		}
		if err == nil {
			accepted++
		} else {
			rejected++
		}
	}
	for _, c := range p.Consistency {
		err := VerifyConsistency(c.Size1, c.Size2, testvectors.Bytes(c.Proof), c.Root1, c.Root2)
		if (err == nil) != c.WantValid {
			t.Errorf("%s: valid=%v, want %v (err %v)", c.File, err == nil, c.WantValid, err)
		}
		if err == nil {
			accepted++
		} else {
			rejected++
		}
	}
	if accepted != 12 || rejected != 184 {
		t.Errorf("accepted %d and rejected %d probes, want 12 and 184", accepted, rejected)
	}
}

// TestSweep checks generated proofs against the RFC's recursive definitions
// and the verifiers, for every inclusion proof up to 300 leaves and every
// consistency proof up to 100, and that flipping any single bit of any proof
// hash is rejected.
func TestSweep(t *testing.T) {
	tree, leaves := newMemTree(300)
	roots := make([]Hash, len(leaves)+1)
	for n := range roots {
		roots[n] = refRoot(leaves[:n])
	}
	flip := 0
	for n := uint64(1); n <= 300; n++ {
		for i := uint64(0); i < n; i++ {
			proof := tree.proof(InclusionRanges(i, n))
			if !equalProofs(proof, refPath(i, leaves[:n])) {
				t.Fatalf("inclusion (%d, %d): differs from PATH", i, n)
			}
			if len(proof) != InclusionLength(i, n) {
				t.Fatalf("inclusion (%d, %d): length %d, InclusionLength %d", i, n, len(proof), InclusionLength(i, n))
			}
			if err := VerifyInclusion(i, n, leaves[i][:], proof, roots[n][:]); err != nil {
				t.Fatalf("inclusion (%d, %d): %v", i, n, err)
			}
			for j := range proof {
				bad := cloneProof(proof)
				bad[j][flip/8%HashSize] ^= 1 << (flip % 8)
				flip++
				if err := VerifyInclusion(i, n, leaves[i][:], bad, roots[n][:]); !errors.Is(err, ErrRootMismatch) {
					t.Fatalf("inclusion (%d, %d) with proof[%d] flipped: %v", i, n, j, err)
				}
			}
		}
	}
	for n := uint64(1); n <= 100; n++ {
		for m := uint64(1); m <= n; m++ {
			proof := tree.proof(ConsistencyRanges(m, n))
			if !equalProofs(proof, refProof(m, leaves[:n])) {
				t.Fatalf("consistency (%d, %d): differs from PROOF", m, n)
			}
			if m < n && len(proof) != ConsistencyLength(m, n) {
				t.Fatalf("consistency (%d, %d): length %d, ConsistencyLength %d", m, n, len(proof), ConsistencyLength(m, n))
			}
			if err := VerifyConsistency(m, n, proof, roots[m][:], roots[n][:]); err != nil {
				t.Fatalf("consistency (%d, %d): %v", m, n, err)
			}
			for j := range proof {
				bad := cloneProof(proof)
				bad[j][flip/8%HashSize] ^= 1 << (flip % 8)
				flip++
				if err := VerifyConsistency(m, n, bad, roots[m][:], roots[n][:]); !errors.Is(err, ErrRootMismatch) {
					t.Fatalf("consistency (%d, %d) with proof[%d] flipped: %v", m, n, j, err)
				}
			}
		}
	}
}

// TestEveryBit flips every bit of every hash of the proofs in one mid-sized
// tree, to complement the rotating single flips of TestSweep.
func TestEveryBit(t *testing.T) {
	const n = 45
	tree, leaves := newMemTree(n)
	root := refRoot(leaves)
	for i := uint64(0); i < n; i++ {
		proof := tree.proof(InclusionRanges(i, n))
		for j := range proof {
			for bit := 0; bit < 8*HashSize; bit++ {
				bad := cloneProof(proof)
				bad[j][bit/8] ^= 1 << (bit % 8)
				if err := VerifyInclusion(i, n, leaves[i][:], bad, root[:]); err == nil {
					t.Fatalf("inclusion (%d, %d) with proof[%d] bit %d flipped verified", i, n, j, bit)
				}
			}
		}
	}
	for m := uint64(1); m < n; m++ {
		proof := tree.proof(ConsistencyRanges(m, n))
		root1 := refRoot(leaves[:m])
		for j := range proof {
			for bit := 0; bit < 8*HashSize; bit++ {
				bad := cloneProof(proof)
				bad[j][bit/8] ^= 1 << (bit % 8)
				if err := VerifyConsistency(m, n, bad, root1[:], root[:]); err == nil {
					t.Fatalf("consistency (%d, %d) with proof[%d] bit %d flipped verified", m, n, j, bit)
				}
			}
		}
	}
}

func cloneProof(p [][]byte) [][]byte {
	out := make([][]byte, len(p))
	for i := range p {
		out[i] = bytes.Clone(p[i])
	}
	return out
}

func TestVerifierRejectsMalformed(t *testing.T) {
	tree, leaves := newMemTree(13)
	root := refRoot(leaves)
	proof := tree.proof(InclusionRanges(5, 13))
	short := cloneProof(proof)
	short[1] = short[1][:31]
	cproof := tree.proof(ConsistencyRanges(6, 13))
	root6 := refRoot(leaves[:6])
	tests := []struct {
		name string
		err  error
		want error
	}{
		{"index = size", VerifyInclusion(13, 13, leaves[0][:], proof, root[:]), ErrIndex},
		{"index > size", VerifyInclusion(1<<63, 13, leaves[0][:], proof, root[:]), ErrIndex},
		{"short leaf hash", VerifyInclusion(5, 13, leaves[5][:31], proof, root[:]), ErrHashSize},
		{"long root", VerifyInclusion(5, 13, leaves[5][:], proof, append(root[:], 0)), ErrHashSize},
		{"short proof hash", VerifyInclusion(5, 13, leaves[5][:], short, root[:]), ErrHashSize},
		{"proof too short", VerifyInclusion(5, 13, leaves[5][:], proof[:len(proof)-1], root[:]), ErrProofLength},
		{"proof too long", VerifyInclusion(5, 13, leaves[5][:], append(cloneProof(proof), root[:]), root[:]), ErrProofLength},
		{"wrong leaf", VerifyInclusion(5, 13, leaves[4][:], proof, root[:]), ErrRootMismatch},
		{"size 0", VerifyInclusion(0, 0, leaves[0][:], nil, EmptyRoot[:]), ErrIndex},
		{"consistency from 0", VerifyConsistency(0, 13, nil, EmptyRoot[:], root[:]), ErrSize},
		{"consistency backwards", VerifyConsistency(13, 6, cproof, root[:], root6[:]), ErrSize},
		{"consistency short", VerifyConsistency(6, 13, cproof[:1], root6[:], root[:]), ErrProofLength},
		{"consistency extra", VerifyConsistency(6, 13, append(cloneProof(cproof), root[:]), root6[:], root[:]), ErrProofLength},
		{"consistency bad hash size", VerifyConsistency(6, 13, cproof, root6[:20], root[:]), ErrHashSize},
		{"consistency swapped roots", VerifyConsistency(6, 13, cproof, root[:], root6[:]), ErrRootMismatch},
		{"equal sizes with proof", VerifyConsistency(13, 13, cproof, root[:], root[:]), ErrProofLength},
	}
	for _, tc := range tests {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, tc.err, tc.want)
		}
	}
	if err := VerifyConsistency(6, 13, cproof, root6[:], root[:]); err != nil {
		t.Fatalf("control: %v", err)
	}
	if err := VerifyInclusion(5, 13, leaves[5][:], proof, root[:]); err != nil {
		t.Fatalf("control: %v", err)
	}
}

func TestCover(t *testing.T) {
	for _, tc := range []struct {
		begin, end uint64
		want       []NodeID
	}{
		{0, 0, nil},
		{0, 1, []NodeID{{0, 0}}},
		{0, 7, []NodeID{{2, 0}, {1, 2}, {0, 6}}},
		{8, 13, []NodeID{{2, 2}, {0, 12}}},
		{3, 9, []NodeID{{0, 3}, {2, 1}, {0, 8}}},
		{0, 1 << 40, []NodeID{{40, 0}}},
	} {
		got := Cover(tc.begin, tc.end)
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("Cover(%d, %d) = %v, want %v", tc.begin, tc.end, got, tc.want)
		}
	}
	if _, err := NewFrontier(5, make([]Hash, 3)); err == nil {
		t.Error("NewFrontier accepted the wrong number of hashes")
	}
	if r := unhex(t, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"); !bytes.Equal(r, EmptyRoot[:]) {
		t.Error("EmptyRoot")
	}
}

// FuzzVerify feeds arbitrary sizes and proof bytes, cut into 32-byte hashes
// or not, to both verifiers over a fixed tree: nothing panics, and only the
// true proof verifies.
func FuzzVerify(f *testing.F) {
	tree, leaves := newMemTree(21)
	roots := make([]Hash, 22)
	for n := range roots {
		roots[n] = refRoot(leaves[:n])
	}
	flat := func(p [][]byte) []byte { return bytes.Join(p, nil) }
	f.Add(uint64(5), uint64(21), flat(tree.proof(InclusionRanges(5, 21))), uint8(32))
	f.Add(uint64(7), uint64(21), flat(tree.proof(ConsistencyRanges(7, 21))), uint8(32))
	f.Add(uint64(0), uint64(1), []byte{}, uint8(0))
	f.Fuzz(func(t *testing.T, a, b uint64, raw []byte, cut uint8) {
		var proof [][]byte
		step := int(cut%64) + 1
		for len(raw) > 0 {
			n := min(step, len(raw))
			proof = append(proof, raw[:n])
			raw = raw[n:]
		}
		a, b = a%23, b%23 // around the tree, sizes just past it included
		if b <= 21 && a < b {
			if err := VerifyInclusion(a, b, leaves[a][:], proof, roots[b][:]); err == nil &&
				!equalProofs(proof, tree.proof(InclusionRanges(a, b))) {
				t.Fatalf("wrong inclusion proof verified for (%d, %d)", a, b)
			}
		}
		if a <= 21 && b <= 21 {
			if err := VerifyConsistency(a, b, proof, roots[a][:], roots[b][:]); err == nil &&
				!equalProofs(proof, tree.proof(ConsistencyRanges(a, b))) {
				t.Fatalf("wrong consistency proof verified for (%d, %d)", a, b)
			}
		}
	})
}
