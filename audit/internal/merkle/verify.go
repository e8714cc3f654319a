package merkle

import (
	"bytes"
	"fmt"
	"math/bits"
)

// VerifyInclusion checks that leafHash is the leaf at index in the tree of
// the given size with the given root (RFC 9162 §2.1.3.2). Every hash must be
// 32 bytes and the proof exactly as long as the tree shape requires.
func VerifyInclusion(index, size uint64, leafHash []byte, proof [][]byte, root []byte) error {
	if index >= size {
		return fmt.Errorf("inclusion: index %d, size %d: %w", index, size, ErrIndex)
	}
	if err := checkHashes(leafHash, root, proof); err != nil {
		return fmt.Errorf("inclusion: %w", err)
	}
	if want := InclusionLength(index, size); len(proof) != want {
		return fmt.Errorf("inclusion: %d hashes, want %d: %w", len(proof), want, ErrProofLength)
	}
	got := RootFromInclusion(index, size, Hash(leafHash), proof)
	if !bytes.Equal(got[:], root) {
		return fmt.Errorf("inclusion: %w", ErrRootMismatch)
	}
	return nil
}

// RootFromInclusion computes the root implied by an inclusion proof whose
// shape the caller has checked (index < size, len(proof) ==
// InclusionLength(index, size), every hash 32 bytes).
func RootFromInclusion(index, size uint64, leaf Hash, proof [][]byte) Hash {
	fn, sn := index, size-1
	r := leaf
	for _, p := range proof {
		if fn&1 == 1 || fn == sn {
			r = nodeHashBytes(p, r[:])
			for fn&1 == 0 && fn != 0 {
				fn >>= 1
				sn >>= 1
			}
		} else {
			r = nodeHashBytes(r[:], p)
		}
		fn >>= 1
		sn >>= 1
	}
	return r
}

// InclusionLength is the number of hashes in the inclusion proof of index in
// a tree of size leaves (index < size).
func InclusionLength(index, size uint64) int {
	// Levels where the paths to index and to the last leaf have diverged
	// contribute a sibling each; above that, one hash per left turn of the
	// right border.
	inner := bits.Len64(index ^ (size - 1))
	border := bits.OnesCount64(index >> inner)
	return inner + border
}

// VerifyConsistency checks that the tree of size1 with root1 is a prefix of
// the tree of size2 with root2 (RFC 9162 §2.1.4.2). A proof from the empty
// tree is refused: it proves nothing. Identical sizes need an empty proof and
// identical roots, which are compared as given since nothing is hashed.
func VerifyConsistency(size1, size2 uint64, proof [][]byte, root1, root2 []byte) error {
	switch {
	case size1 == 0:
		return fmt.Errorf("consistency: from the empty tree: %w", ErrSize)
	case size1 > size2:
		return fmt.Errorf("consistency: size1 %d > size2 %d: %w", size1, size2, ErrSize)
	case size1 == size2:
		if len(proof) != 0 {
			return fmt.Errorf("consistency: equal sizes need an empty proof, got %d hashes: %w", len(proof), ErrProofLength)
		}
		if !bytes.Equal(root1, root2) {
			return fmt.Errorf("consistency: equal sizes, different roots: %w", ErrRootMismatch)
		}
		return nil
	}
	if err := checkHashes(root1, root2, proof); err != nil {
		return fmt.Errorf("consistency: %w", err)
	}
	if want := ConsistencyLength(size1, size2); len(proof) != want {
		return fmt.Errorf("consistency: %d hashes, want %d: %w", len(proof), want, ErrProofLength)
	}
	path := proof
	if size1&(size1-1) == 0 {
		// A power-of-two first tree is a complete subtree of the second: its
		// root is the proof's implicit first element.
		path = append([][]byte{root1}, proof...)
	}
	fn, sn := size1-1, size2-1
	for fn&1 == 1 {
		fn >>= 1
		sn >>= 1
	}
	fr, sr := Hash(path[0]), Hash(path[0])
	for _, c := range path[1:] {
		if sn == 0 {
			return fmt.Errorf("consistency: %w", ErrProofLength)
		}
		if fn&1 == 1 || fn == sn {
			fr = nodeHashBytes(c, fr[:])
			sr = nodeHashBytes(c, sr[:])
			for fn&1 == 0 && fn != 0 {
				fn >>= 1
				sn >>= 1
			}
		} else {
			sr = nodeHashBytes(sr[:], c)
		}
		fn >>= 1
		sn >>= 1
	}
	if sn != 0 {
		return fmt.Errorf("consistency: %w", ErrProofLength)
	}
	if !bytes.Equal(fr[:], root1) {
		return fmt.Errorf("consistency: first root: %w", ErrRootMismatch)
	}
	if !bytes.Equal(sr[:], root2) {
		return fmt.Errorf("consistency: second root: %w", ErrRootMismatch)
	}
	return nil
}

// ConsistencyLength is the number of hashes in the consistency proof between
// trees of size1 and size2 leaves (0 < size1 < size2).
func ConsistencyLength(size1, size2 uint64) int {
	// The subtree of size2 where size1 stops being a complete left part,
	// then the right border above it (as in transparency-dev/merkle).
	level := bits.TrailingZeros64(size1)
	index := (size1 - 1) >> level
	n := InclusionLength(index, ((size2-1)>>level)+1)
	if index == 0 {
		return n
	}
	return n + 1
}

func checkHashes(a, b []byte, proof [][]byte) error {
	if len(a) != HashSize || len(b) != HashSize {
		return ErrHashSize
	}
	for i, p := range proof {
		if len(p) != HashSize {
			return fmt.Errorf("proof[%d]: %w", i, ErrHashSize)
		}
	}
	return nil
}
