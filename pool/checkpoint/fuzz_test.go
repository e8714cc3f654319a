package checkpoint

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
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
		"trailing":         string(good) + " ",
		"unknown field":    `{"format":1,"job":"","step":0,"cursor":{"epoch":0,"offset":0,"shard":""},"params":[],"x":1}`,
		"format 2":         `{"format":2,"job":"","step":0,"cursor":{"epoch":0,"offset":0,"shard":""},"params":[]}`,
		"null params":      `{"format":1,"job":"","step":0,"cursor":{"epoch":0,"offset":0,"shard":""},"params":null}`,
		"reordered":        `{"job":"","format":1,"step":0,"cursor":{"epoch":0,"offset":0,"shard":""},"params":[]}`,
		"negative step":    `{"format":1,"job":"","step":-1,"cursor":{"epoch":0,"offset":0,"shard":""},"params":[]}`,
		"zero parent":      `{"format":1,"job":"","step":0,"parent":"0000000000000000000000000000000000000000000000000000000000000000","cursor":{"epoch":0,"offset":0,"shard":""},"params":[]}`,
		"empty rng":        `{"format":1,"job":"","step":0,"cursor":{"epoch":0,"offset":0,"shard":""},"rng":"","params":[]}`,
		"size mismatch":    `{"format":1,"job":"","step":0,"cursor":{"epoch":0,"offset":0,"shard":""},"params":[{"name":"w","shape":[3],"chunks":[{"digest":"` + Sum(nil).String() + `","size":8}]}]}`,
		"huge shape":       `{"format":1,"job":"","step":0,"cursor":{"epoch":0,"offset":0,"shard":""},"params":[{"name":"w","shape":[4611686018427387904,4],"chunks":[]}]}`,
		"upper hex":        `{"format":1,"job":"","step":0,"cursor":{"epoch":0,"offset":0,"shard":""},"params":[{"name":"w","shape":[1],"chunks":[{"digest":"` + "E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855" + `","size":4}]}]}`,
		"duplicate name":   `{"format":1,"job":"","step":0,"cursor":{"epoch":0,"offset":0,"shard":""},"params":[{"name":"w","shape":[],"chunks":[]},{"name":"w","shape":[],"chunks":[]}]}`,
		"empty files":      filesManifest(`[]`),
		"null file chunks": filesManifest(`[{"name":"a","size":0,"chunks":null}]`),
		"unsorted files":   filesManifest(`[{"name":"b","size":0,"chunks":[]},{"name":"a","size":0,"chunks":[]}]`),
		"duplicate file":   filesManifest(`[{"name":"a","size":0,"chunks":[]},{"name":"a","size":0,"chunks":[]}]`),
		"file in a dir":    filesManifest(`[{"name":"d/a","size":0,"chunks":[]}]`),
		"file dot dot":     filesManifest(`[{"name":"..","size":0,"chunks":[]}]`),
		"file nul":         filesManifest(`[{"name":"a\u0000","size":0,"chunks":[]}]`),
		"file no name":     filesManifest(`[{"name":"","size":0,"chunks":[]}]`),
		"file long name":   filesManifest(`[{"name":"` + strings.Repeat("n", MaxFileNameBytes+1) + `","size":0,"chunks":[]}]`),
		"file size":        filesManifest(`[{"name":"a","size":4,"chunks":[{"digest":"` + Sum([]byte("abc")).String() + `","size":3}]}]`),
		"file zero chunk":  filesManifest(`[{"name":"a","size":0,"chunks":[{"digest":"` + Sum(nil).String() + `","size":0}]}]`),
		"file unknown key": filesManifest(`[{"name":"a","size":0,"chunks":[],"mode":420}]`),
	} {
		if _, err := DecodeManifest([]byte(b)); !errors.Is(err, ErrInvalidManifest) {
			t.Errorf("%s: %v, want ErrInvalidManifest", name, err)
		}
	}
	if _, err := DecodeManifest(make([]byte, MaxManifestBytes+1)); !errors.Is(err, ErrInvalidManifest) {
		t.Errorf("oversize: %v", err)
	}
}

// filesManifestSample is a valid manifest of a command job's checkpoint:
// files and no tensors.
func filesManifestSample(t testing.TB) []byte {
	t.Helper()
	m := &Manifest{
		Format: 1, Job: "job-cmd", Step: 40, Parent: Sum([]byte("parent")), Params: []TensorEntry{},
		Files: []FileEntry{
			{Name: "model.safetensors", Size: 7, Chunks: []Chunk{{Sum([]byte("abcd")), 4}, {Sum([]byte("efg")), 3}}},
			{Name: "optimizer.safetensors", Size: 0, Chunks: []Chunk{}},
			{Name: "state.json", Size: 2, Chunks: []Chunk{{Sum([]byte("{}")), 2}}},
		},
	}
	b, _, err := m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func filesManifest(files string) string {
	return `{"format":1,"job":"","step":0,"cursor":{"epoch":0,"offset":0,"shard":""},"params":[],"files":` + files + `}`
}

func TestDecodeManifestFiles(t *testing.T) {
	good := filesManifestSample(t)
	m, err := DecodeManifest(good)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Files) != 3 || m.Files[0].Size != 7 || len(m.Blobs()) != 3 {
		t.Fatalf("decoded %+v", m)
	}
	if _, err := DecodeManifest([]byte(filesManifest(`[{"name":"a","size":0,"chunks":[]}]`))); err != nil {
		t.Fatalf("minimal manifest with a file: %v", err)
	}
	// The total of all files is bounded, not only each chunk.
	var fs []FileEntry
	for i := range 2 {
		e := FileEntry{Name: fmt.Sprintf("f%d", i), Chunks: []Chunk{}}
		for range MaxFilesBytes / MaxChunkBytes / 2 {
			e.Chunks = append(e.Chunks, Chunk{Sum(nil), MaxChunkBytes})
		}
		e.Size = int64(len(e.Chunks)) * MaxChunkBytes
		fs = append(fs, e)
	}
	at := &Manifest{Format: 1, Params: []TensorEntry{}, Files: fs}
	if _, _, err := at.Encode(); err != nil {
		t.Fatalf("files of exactly %d bytes: %v", int64(MaxFilesBytes), err)
	}
	fs[1].Chunks = append(fs[1].Chunks, Chunk{Sum(nil), 1})
	fs[1].Size++
	if _, _, err := at.Encode(); !errors.Is(err, ErrInvalidManifest) {
		t.Fatalf("files of %d bytes: %v, want ErrInvalidManifest", int64(MaxFilesBytes)+1, err)
	}
	many := &Manifest{Format: 1, Params: []TensorEntry{}}
	for i := range MaxFiles + 1 {
		many.Files = append(many.Files, FileEntry{Name: fmt.Sprintf("f%05d", i), Chunks: []Chunk{}})
	}
	if _, _, err := many.Encode(); !errors.Is(err, ErrInvalidManifest) {
		t.Fatalf("%d files: %v, want ErrInvalidManifest", len(many.Files), err)
	}
}

// FuzzDecodeManifest feeds untrusted bytes to the decoder: it must not
// panic, must refuse with ErrInvalidManifest, and whatever it accepts must
// be within the limits and re-encode to the very same bytes (one id per
// checkpoint).
func FuzzDecodeManifest(f *testing.F) {
	f.Add(validManifestBytes(f))
	f.Add(filesManifestSample(f))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeManifest(b)
		if err != nil {
			if !errors.Is(err, ErrInvalidManifest) {
				t.Fatalf("error does not wrap ErrInvalidManifest: %v", err)
			}
			return
		}
		if len(m.Params) > MaxTensors || len(m.Optimizer) > MaxTensors || len(m.RNG) > MaxRNGBytes || len(m.Files) > MaxFiles {
			t.Fatalf("accepted a manifest over the limits")
		}
		var total int64
		for i, fe := range m.Files {
			if fe.Name == "" || fe.Name == "." || fe.Name == ".." || strings.ContainsAny(fe.Name, "/\x00") || len(fe.Name) > MaxFileNameBytes {
				t.Fatalf("accepted file name %q", fe.Name)
			}
			if i > 0 && m.Files[i-1].Name >= fe.Name {
				t.Fatalf("accepted files out of order: %q after %q", fe.Name, m.Files[i-1].Name)
			}
			total += fe.Size
		}
		if total > MaxFilesBytes {
			t.Fatalf("accepted files of %d bytes", total)
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
