package merkle

import (
	"fmt"
	"math/bits"
)

// Frontier is the compact range [0, Size): the hashes of the complete
// subtrees that Cover(0, Size) lists, largest first. It is all the state an
// append needs, at most 64 hashes.
type Frontier struct {
	size   uint64
	hashes []Hash
}

// NewFrontier rebuilds a frontier from the hashes of Cover(0, size).
func NewFrontier(size uint64, hashes []Hash) (*Frontier, error) {
	if len(hashes) != bits.OnesCount64(size) {
		return nil, fmt.Errorf("frontier: size %d needs %d hashes, got %d", size, bits.OnesCount64(size), len(hashes))
	}
	return &Frontier{size: size, hashes: append([]Hash(nil), hashes...)}, nil
}

// Size is the number of leaves appended so far.
func (f *Frontier) Size() uint64 { return f.size }

// Clone returns an independent copy, so a failed batch can be dropped.
func (f *Frontier) Clone() *Frontier {
	return &Frontier{size: f.size, hashes: append([]Hash(nil), f.hashes...)}
}

// Append adds a leaf hash and calls visit for it and for every complete
// subtree the append completes, bottom up.
func (f *Frontier) Append(leaf Hash, visit func(NodeID, Hash)) {
	id := NodeID{Level: 0, Index: f.size}
	h := leaf
	visit(id, h)
	for id.Index&1 == 1 {
		h = NodeHash(f.hashes[len(f.hashes)-1], h)
		f.hashes = f.hashes[:len(f.hashes)-1]
		id = NodeID{Level: id.Level + 1, Index: id.Index >> 1}
		visit(id, h)
	}
	f.hashes = append(f.hashes, h)
	f.size++
}

// Root returns the RFC 6962 root of the leaves appended so far.
func (f *Frontier) Root() Hash { return RangeHash(f.hashes) }
