// Package testvectors locates and loads the shared conformance vectors
// (RFC 6962 Merkle trees and proofs, Ed25519 signed notes) for tests.
//
// The folder is $FLEETLEARN_TESTVECTORS, or else ../shared/testvectors
// relative to the repository root (the nearest folder above the working
// directory holding go.mod). Tests that need it are skipped, with the path
// that was tried, when it does not exist.
package testvectors

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// EnvVar overrides the vectors folder.
const EnvVar = "FLEETLEARN_TESTVECTORS"

// Dir returns the vectors folder or skips the test.
func Dir(tb testing.TB) string {
	tb.Helper()
	dir := os.Getenv(EnvVar)
	if dir == "" {
		root, err := repoRoot()
		if err != nil {
			tb.Skipf("test vectors: %v; set %s", err, EnvVar)
		}
		dir = filepath.Join(root, "..", "shared", "testvectors")
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		tb.Skipf("test vectors folder %s is absent; set %s to run the conformance tests", dir, EnvVar)
	}
	return dir
}

// Load decodes one JSON file of the vectors folder into v, or skips.
func Load(tb testing.TB, name string, v any) {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join(Dir(tb), name))
	if err != nil {
		tb.Fatalf("test vectors: %v", err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		tb.Fatalf("test vectors: %s: %v", name, err)
	}
}

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

// Hex is a byte string written as lowercase hex in the vector files.
type Hex []byte

// UnmarshalJSON decodes a hex string.
func (h *Hex) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	d, err := hex.DecodeString(s)
	if err != nil {
		return err
	}
	*h = d
	return nil
}

// Bytes converts a list of hex strings to byte slices, keeping nil as nil.
func Bytes(hs []Hex) [][]byte {
	if hs == nil {
		return nil
	}
	out := make([][]byte, len(hs))
	for i, h := range hs {
		out[i] = h
	}
	return out
}

// RFC6962 is rfc6962_vectors.json.
type RFC6962 struct {
	Leaves []struct {
		Index    uint64 `json:"index"`
		Input    Hex    `json:"input"`
		LeafHash Hex    `json:"leaf_hash"`
	} `json:"leaves"`
	Roots []struct {
		TreeSize uint64 `json:"tree_size"`
		Root     Hex    `json:"root"`
	} `json:"roots"`
	SubtreeHashes []struct {
		Level uint8  `json:"level"`
		Index uint64 `json:"index"`
		Start uint64 `json:"start"`
		End   uint64 `json:"end"`
		Hash  Hex    `json:"hash"`
	} `json:"subtree_hashes"`
	HasherVectors []struct {
		Desc  string `json:"desc"`
		Kind  string `json:"kind"`
		Input Hex    `json:"input"`
		Left  Hex    `json:"left"`
		Right Hex    `json:"right"`
		Want  Hex    `json:"want"`
	} `json:"hasher_vectors"`
	InclusionProofs []struct {
		LeafIndex uint64 `json:"leaf_index"`
		TreeSize  uint64 `json:"tree_size"`
		LeafInput Hex    `json:"leaf_input"`
		LeafHash  Hex    `json:"leaf_hash"`
		Root      Hex    `json:"root"`
		Proof     []Hex  `json:"proof"`
	} `json:"inclusion_proofs"`
	ConsistencyProofs []struct {
		Size1 uint64 `json:"size1"`
		Size2 uint64 `json:"size2"`
		Root1 Hex    `json:"root1"`
		Root2 Hex    `json:"root2"`
		Proof []Hex  `json:"proof"`
	} `json:"consistency_proofs"`
}

// Probes is rfc6962_probes.json.
type Probes struct {
	Inclusion []struct {
		File      string `json:"file"`
		Desc      string `json:"desc"`
		WantValid bool   `json:"want_valid"`
		LeafIndex uint64 `json:"leaf_index"`
		TreeSize  uint64 `json:"tree_size"`
		LeafHash  Hex    `json:"leaf_hash"`
		Root      Hex    `json:"root"`
		Proof     []Hex  `json:"proof"`
	} `json:"inclusion"`
	Consistency []struct {
		File      string `json:"file"`
		Desc      string `json:"desc"`
		WantValid bool   `json:"want_valid"`
		Size1     uint64 `json:"size1"`
		Size2     uint64 `json:"size2"`
		Root1     Hex    `json:"root1"`
		Root2     Hex    `json:"root2"`
		Proof     []Hex  `json:"proof"`
	} `json:"consistency"`
}

// SignedNotes is signed_note_vectors.json.
type SignedNotes struct {
	Keys []struct {
		Name string `json:"name"`
		VKey string `json:"vkey"`
		SKey string `json:"skey"`
	} `json:"keys"`
	Sign []struct {
		Desc     string `json:"desc"`
		SKey     string `json:"skey"`
		Text     string `json:"text"`
		WantNote string `json:"want_note"`
	} `json:"sign"`
	Open []struct {
		Desc         string   `json:"desc"`
		Note         string   `json:"note"`
		VerifierKeys []string `json:"verifier_keys"`
		Want         string   `json:"want"`
		WantVerified []string `json:"want_verified"`
		Checkpoint   *struct {
			Origin string `json:"origin"`
			Size   uint64 `json:"size"`
		} `json:"checkpoint"`
	} `json:"open"`
}
