package audit

import (
	"fmt"

	"github.com/fleetlearn/fleetlearn/audit/internal/merkle"
)

// VerifyInclusion checks an RFC 9162 §2.1.3 inclusion proof: that the leaf
// with leafHash is at index in the tree of size leaves whose root is root.
// Hashes must be 32 bytes, index below size, and the proof exactly as long
// as the tree's shape requires. Failures wrap ErrInvalidProof and one of
// ErrHashSize, ErrIndexRange, ErrProofLength or ErrRootMismatch.
func VerifyInclusion(index, size uint64, leafHash []byte, proof [][]byte, root []byte) error {
	if err := merkle.VerifyInclusion(index, size, leafHash, proof, root); err != nil {
		return fmt.Errorf("audit: %w: %w", ErrInvalidProof, err)
	}
	return nil
}

// VerifyConsistency checks an RFC 9162 §2.1.4 consistency proof: that the
// tree of size1 leaves with root1 is a prefix of the tree of size2 leaves
// with root2. size1 must be at least 1 (every tree extends the empty one, so
// that proof proves nothing); equal sizes need an empty proof and equal
// roots. Failures wrap ErrInvalidProof and one of ErrHashSize,
// ErrTreeSize, ErrProofLength or ErrRootMismatch.
func VerifyConsistency(size1, size2 uint64, proof [][]byte, root1, root2 []byte) error {
	if err := merkle.VerifyConsistency(size1, size2, proof, root1, root2); err != nil {
		return fmt.Errorf("audit: %w: %w", ErrInvalidProof, err)
	}
	return nil
}
