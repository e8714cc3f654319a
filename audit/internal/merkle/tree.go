package merkle

// Tree holds every complete subtree hash of a list of leaves in memory, so
// that proofs for all of them can be produced without a store: an export
// with a proof for each entry needs one pass over the leaves, not one
// store read per entry. It takes about 64 bytes per leaf.
type Tree struct {
	levels [][]Hash // levels[l][i] is NodeID{l, i}
}

// NewTree builds the tree of the given leaf hashes. It keeps leaves.
func NewTree(leaves []Hash) *Tree {
	t := &Tree{levels: [][]Hash{leaves}}
	for cur := leaves; len(cur) > 1; {
		next := make([]Hash, len(cur)/2)
		for i := range next {
			next[i] = NodeHash(cur[2*i], cur[2*i+1])
		}
		t.levels = append(t.levels, next)
		cur = next
	}
	return t
}

// Size is the number of leaves.
func (t *Tree) Size() uint64 { return uint64(len(t.levels[0])) }

// Leaf returns the hash of leaf i (i < Size).
func (t *Tree) Leaf(i uint64) Hash { return t.levels[0][i] }

// hash returns the hash of a range within the tree.
func (t *Tree) hash(r Range) Hash {
	c := Cover(r.Begin, r.End)
	hs := make([]Hash, len(c))
	for i, id := range c {
		hs[i] = t.levels[id.Level][id.Index]
	}
	return RangeHash(hs)
}

func (t *Tree) hashes(rs []Range) []Hash {
	out := make([]Hash, len(rs))
	for i, r := range rs {
		out[i] = t.hash(r)
	}
	return out
}

// Root returns the root of the first size leaves (size <= Size).
func (t *Tree) Root(size uint64) Hash { return t.hash(Range{0, size}) }

// InclusionProof returns the RFC 9162 inclusion proof of leaf index in the
// tree of the first size leaves; ok is false unless index < size <= Size.
func (t *Tree) InclusionProof(index, size uint64) (proof []Hash, ok bool) {
	if index >= size || size > t.Size() {
		return nil, false
	}
	return t.hashes(InclusionRanges(index, size)), true
}

// ConsistencyProof returns the RFC 9162 consistency proof between the
// trees of the first size1 and size2 leaves; ok is false unless
// 0 < size1 <= size2 <= Size.
func (t *Tree) ConsistencyProof(size1, size2 uint64) (proof []Hash, ok bool) {
	if size1 == 0 || size1 > size2 || size2 > t.Size() {
		return nil, false
	}
	return t.hashes(ConsistencyRanges(size1, size2)), true
}
