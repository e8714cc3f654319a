package checkpoint

import (
	"bytes"
	"errors"
	"testing"
)

func validManifestBytes(t testing.TB) []byte {
	t.Helper()
	m := &Manifest{
		Format: 1, Job: "job-1", Step: 12, Parent: Sum([]byte("parent")),
		Cursor: Cursor{Epoch: 1, Offset: 64, Shard: "s0"},
		RNG:    []byte{1, 2, 3},
		Params: []TensorEntry{
			{Name: "w", Shape: []int{2, 3}, Chunks: []Chunk{{Sum([]byte("a")), 16}, {Sum([]byte("b")), 8}}},
			{Name: "scalar", Shape: []int{}, Chunks: []Chunk{{Sum([]byte("c")), 4}}},
		},
		Optimizer: []TensorEntry{{Name: "m", Shape: []int{0}, Chunks: []Chunk{}}},
	}
	b, _, err := m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeManifestStrict(t *testing.T) {
	good := validManifestBytes(t)
	m, err := DecodeManifest(good)
	if err != nil {
		t.Fatal(err)
	}
	if m.Step != 12 || len(m.Params) != 2 || m.Params[0].Chunks[1].Size != 8 {
		t.Fatalf("decoded %+v", m)
	}
	for name, b := range map[string]string{
		"trailing":       string(good) + " ",
		"unknown field":  `{"format":1,"job":"","step":0,"cursor":{"epoch":0,"offset":0,"shard":""},"params":[],"x":1}`,
		"format 2":       `{"format":2,"job":"","step":0,"cursor":{"epoch":0,"offset":0,"shard":""},"params":[]}`,
		"null params":    `{"format":1,"job":"","step":0,"cursor":{"epoch":0,"offset":0,"shard":""},"params":null}`,
		"reordered":      `{"job":"","format":1,"step":0,"cursor":{"epoch":0,"offset":0,"shard":""},"params":[]}`,
		"negative step":  `{"format":1,"job":"","step":-1,"cursor":{"epoch":0,"offset":0,"shard":""},"params":[]}`,
		"zero parent":    `{"format":1,"job":"","step":0,"parent":"0000000000000000000000000000000000000000000000000000000000000000","cursor":{"epoch":0,"offset":0,"shard":""},"params":[]}`,
		"empty rng":      `{"format":1,"job":"","step":0,"cursor":{"epoch":0,"offset":0,"shard":""},"rng":"","params":[]}`,
		"size mismatch":  `{"format":1,"job":"","step":0,"cursor":{"epoch":0,"offset":0,"shard":""},"params":[{"name":"w","shape":[3],"chunks":[{"digest":"` + Sum(nil).String() + `","size":8}]}]}`,
		"huge shape":     `{"format":1,"job":"","step":0,"cursor":{"epoch":0,"offset":0,"shard":""},"params":[{"name":"w","shape":[4611686018427387904,4],"chunks":[]}]}`,
		"upper hex":      `{"format":1,"job":"","step":0,"cursor":{"epoch":0,"offset":0,"shard":""},"params":[{"name":"w","shape":[1],"chunks":[{"digest":"` + "E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855" + `","size":4}]}]}`,
		"duplicate name": `{"format":1,"job":"","step":0,"cursor":{"epoch":0,"offset":0,"shard":""},"params":[{"name":"w","shape":[],"chunks":[]},{"name":"w","shape":[],"chunks":[]}]}`,
	} {
		if _, err := DecodeManifest([]byte(b)); !errors.Is(err, ErrInvalidManifest) {
			t.Errorf("%s: %v, want ErrInvalidManifest", name, err)
		}
	}
	if _, err := DecodeManifest(make([]byte, MaxManifestBytes+1)); !errors.Is(err, ErrInvalidManifest) {
		t.Errorf("oversize: %v", err)
	}
}

// FuzzDecodeManifest feeds untrusted bytes to the decoder: it must not
// panic, must refuse with ErrInvalidManifest, and whatever it accepts must
// be within the limits and re-encode to the very same bytes (one id per
// checkpoint).
func FuzzDecodeManifest(f *testing.F) {
	f.Add(validManifestBytes(f))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeManifest(b)
		if err != nil {
			if !errors.Is(err, ErrInvalidManifest) {
				t.Fatalf("error does not wrap ErrInvalidManifest: %v", err)
			}
			return
		}
		if len(m.Params) > MaxTensors || len(m.Optimizer) > MaxTensors || len(m.RNG) > MaxRNGBytes {
			t.Fatalf("accepted a manifest over the limits")
		}
		for _, c := range m.Blobs() {
			if c.Size <= 0 || c.Size > MaxChunkBytes {
				t.Fatalf("accepted chunk size %d", c.Size)
			}
		}
		again, id, err := m.Encode()
		if err != nil {
			t.Fatalf("accepted manifest does not encode: %v", err)
		}
		if !bytes.Equal(again, b) || id != Sum(b) {
			t.Fatalf("accepted non-canonical bytes:\n%s\nre-encodes as\n%s", b, again)
		}
	})
}
