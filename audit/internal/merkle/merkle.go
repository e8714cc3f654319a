// Package merkle implements the RFC 6962 / RFC 9162 Merkle tree with SHA-256:
// leaf and node hashing, the tree shapes behind inclusion and consistency
// proofs, proof verification, and a compact range for appending.
//
// Proof generation is split in two so that a store can answer it with one
// batched read: InclusionRanges and ConsistencyRanges name the subtrees whose
// hashes make up a proof, Cover lists the complete (perfect) subtrees that
// make up each of them, and RangeHash folds those back together.
package merkle

import (
	"crypto/sha256"
	"errors"
	"math/bits"
)

// HashSize is the size of every hash in the tree.
const HashSize = sha256.Size

// Hash is a SHA-256 digest.
type Hash = [HashSize]byte

// EmptyRoot is the root of the empty tree, SHA-256 of the empty string.
var EmptyRoot = Hash(sha256.Sum256(nil))

// LeafHash returns SHA-256(0x00 || data).
func LeafHash(data []byte) Hash {
	h := sha256.New()
	h.Write([]byte{0})
	h.Write(data)
	var out Hash
	h.Sum(out[:0])
	return out
}

// NodeHash returns SHA-256(0x01 || left || right).
func NodeHash(left, right Hash) Hash {
	var buf [1 + 2*HashSize]byte
	buf[0] = 1
	copy(buf[1:], left[:])
	copy(buf[1+HashSize:], right[:])
	return sha256.Sum256(buf[:])
}

// nodeHashBytes is NodeHash over slices the caller has checked to be 32 bytes.
func nodeHashBytes(left, right []byte) Hash {
	var buf [1 + 2*HashSize]byte
	buf[0] = 1
	copy(buf[1:], left)
	copy(buf[1+HashSize:], right)
	return sha256.Sum256(buf[:])
}

// NodeID names the complete subtree at Level covering leaves
// [Index<<Level, (Index+1)<<Level).
type NodeID struct {
	Level uint8
	Index uint64
}

// Range is the half-open leaf range [Begin, End).
type Range struct{ Begin, End uint64 }

// Errors returned by the verifiers. Each failure wraps exactly one of them.
var (
	ErrHashSize     = errors.New("hash is not 32 bytes")
	ErrIndex        = errors.New("leaf index out of range")
	ErrSize         = errors.New("invalid tree sizes")
	ErrProofLength  = errors.New("wrong proof length")
	ErrRootMismatch = errors.New("computed root does not match")
)

// Cover returns the complete subtrees that make up [begin, end), left to
// right, taking at each position the largest aligned subtree that fits.
// For the ranges of an RFC 6962 tree (begin aligned to a power of two at
// least end-begin) these are the subtrees of decreasing size that RangeHash
// folds into MTH(D[begin:end]).
func Cover(begin, end uint64) []NodeID {
	var out []NodeID
	for begin < end {
		level := uint8(bits.TrailingZeros64(begin))
		if begin == 0 {
			level = 63
		}
		for level > 0 && (end-begin)>>level == 0 {
			level--
		}
		out = append(out, NodeID{Level: level, Index: begin >> level})
		begin += 1 << level
	}
	return out
}

// RangeHash folds the hashes of Cover(begin, end), in order, into the
// RFC 6962 hash of that range. It returns EmptyRoot for no hashes.
func RangeHash(hashes []Hash) Hash {
	if len(hashes) == 0 {
		return EmptyRoot
	}
	h := hashes[len(hashes)-1]
	for i := len(hashes) - 2; i >= 0; i-- {
		h = NodeHash(hashes[i], h)
	}
	return h
}

// splitPoint is the largest power of two smaller than n (n >= 2).
func splitPoint(n uint64) uint64 {
	return 1 << (bits.Len64(n-1) - 1)
}

// InclusionRanges returns the ranges whose hashes form the inclusion proof
// of leaf index in a tree of size leaves, leaf level first (RFC 9162
// §2.1.3.1). It returns nil when index >= size.
func InclusionRanges(index, size uint64) []Range {
	if index >= size {
		return nil
	}
	var out []Range
	begin, end := uint64(0), size
	// Walk down from the root, then reverse: the proof runs leaf to root.
	for end-begin > 1 {
		k := splitPoint(end - begin)
		if index < begin+k {
			out = append(out, Range{begin + k, end})
			end = begin + k
		} else {
			out = append(out, Range{begin, begin + k})
			begin += k
		}
	}
	reverse(out)
	return out
}

// ConsistencyRanges returns the ranges whose hashes form the consistency
// proof between trees of size1 and size2 leaves, leaf level first
// (RFC 9162 §2.1.4.1). It returns nil unless 0 < size1 <= size2; the proof
// for size1 == size2 is empty.
func ConsistencyRanges(size1, size2 uint64) []Range {
	if size1 == 0 || size1 > size2 {
		return nil
	}
	var out []Range
	begin, end, m := uint64(0), size2, size1
	complete := true
	for m != end {
		k := splitPoint(end - begin)
		if m-begin <= k {
			out = append(out, Range{begin + k, end})
			end = begin + k
		} else {
			out = append(out, Range{begin, begin + k})
			begin += k
			complete = false
		}
	}
	if !complete {
		out = append(out, Range{begin, end})
	}
	reverse(out)
	return out
}

func reverse(rs []Range) {
	for i, j := 0, len(rs)-1; i < j; i, j = i+1, j-1 {
		rs[i], rs[j] = rs[j], rs[i]
	}
}
