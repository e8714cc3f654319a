package data

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func randomDataset(n, dim, numClasses int, seed uint64) *Dataset {
	r := rand.New(rand.NewPCG(seed, 2))
	d := &Dataset{Features: make([]float32, n*dim), Labels: make([]uint8, n), Dim: dim, NumClasses: numClasses}
	for i := range d.Features {
		d.Features[i] = float32(r.NormFloat64())
	}
	for i := range d.Labels {
		d.Labels[i] = uint8(r.IntN(numClasses))
	}
	return d
}

func TestWriteReadDirRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name          string
		n, dim, class int
	}{
		{"small", 17, 5, 3},
		{"wide", 3, 3000, 10}, // rows span several write buffers
		{"empty", 0, 4, 2},
		{"one class", 4, 1, 1},
		{"256 classes", 300, 2, 256},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "device-0") // WriteDir creates it
			want := randomDataset(tc.n, tc.dim, tc.class, 1)
			if tc.n > 0 {
				want.Features[0] = float32(math.Copysign(0, -1))
				want.Features[len(want.Features)-1] = math.MaxFloat32
			}
			if err := WriteDir(dir, want, "mnist/client-0"); err != nil {
				t.Fatal(err)
			}
			got, err := ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			if !sameDataset(got, want) {
				t.Fatal("dataset changed in round trip")
			}

			entries, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			if want := []string{featuresFile, labelsFile, ManifestFile}; !slices.Equal(names, want) {
				t.Errorf("directory holds %v, want %v", names, want)
			}

			m := readManifest(t, dir)
			if m.Name != "mnist/client-0" || m.NumExamples != tc.n || m.Dim != tc.dim || m.NumClasses != tc.class {
				t.Errorf("manifest = %+v", m)
			}
			fi, err := os.Stat(filepath.Join(dir, featuresFile))
			if err != nil {
				t.Fatal(err)
			}
			if fi.Size() != int64(tc.n*tc.dim*4) || fi.Mode().Perm()&0o077 != 0 {
				t.Errorf("features file: %d bytes, mode %v", fi.Size(), fi.Mode())
			}
		})
	}
}

// sameDataset compares bit patterns, so -0 and +0 differ.
func sameDataset(a, b *Dataset) bool {
	return a.Dim == b.Dim && a.NumClasses == b.NumClasses && slices.Equal(a.Labels, b.Labels) &&
		slices.EqualFunc(a.Features, b.Features, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) })
}

func TestWriteDirLayout(t *testing.T) {
	dir := t.TempDir()
	d := &Dataset{Features: []float32{1, -2}, Labels: []uint8{1, 0}, Dim: 1, NumClasses: 2}
	if err := WriteDir(dir, d, "tiny"); err != nil {
		t.Fatal(err)
	}
	feat, err := os.ReadFile(filepath.Join(dir, featuresFile))
	if err != nil {
		t.Fatal(err)
	}
	if want := []byte{0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0}; !bytes.Equal(feat, want) {
		t.Errorf("features bytes %x, want little-endian float32 %x", feat, want)
	}
	lab, err := os.ReadFile(filepath.Join(dir, labelsFile))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(lab, []byte{1, 0}) {
		t.Errorf("labels bytes %x", lab)
	}
	m := readManifest(t, dir)
	if sum := sha256.Sum256(feat); m.SHA256[featuresFile] != hex.EncodeToString(sum[:]) {
		t.Errorf("manifest features digest %s, file hashes to %x", m.SHA256[featuresFile], sum)
	}
}

func TestWriteDirReplaces(t *testing.T) {
	dir := t.TempDir()
	if err := WriteDir(dir, randomDataset(50, 3, 4, 1), "old"); err != nil {
		t.Fatal(err)
	}
	want := randomDataset(7, 2, 3, 2)
	if err := WriteDir(dir, want, "new"); err != nil {
		t.Fatal(err)
	}
	got, err := ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !sameDataset(got, want) || readManifest(t, dir).Name != "new" {
		t.Error("second WriteDir did not replace the first")
	}
}

func TestWriteDirErrors(t *testing.T) {
	good := randomDataset(3, 2, 2, 1)
	bad := randomDataset(3, 2, 2, 1)
	bad.Features[4] = float32(math.NaN())
	tests := []struct {
		name    string
		d       *Dataset
		dsName  string
		wantErr error
	}{
		{"invalid dataset", bad, "x", ErrInvalidDataset},
		{"nil dataset", nil, "x", ErrInvalidDataset},
		{"empty name", good, "", ErrInvalidArgument},
		{"control character in name", good, "a\nb", ErrInvalidArgument},
		{"long name", good, strings.Repeat("n", 257), ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "ds")
			if err := WriteDir(dir, tt.d, tt.dsName); !errors.Is(err, tt.wantErr) {
				t.Fatalf("WriteDir error = %v, want %v", err, tt.wantErr)
			}
			if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
				t.Error("rejected WriteDir left a directory behind")
			}
		})
	}

	// A directory path that is a file cannot be written.
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteDir(file, good, "x"); err == nil {
		t.Error("WriteDir into a file succeeded")
	}
}

func readManifest(t *testing.T, dir string) Manifest {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if err != nil {
		t.Fatal(err)
	}
	m, err := DecodeManifest(b)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func writeManifest(t *testing.T, dir string, m Manifest) {
	t.Helper()
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ManifestFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// rewrite replaces a data file and records its new digest, so only the
// content checks can catch the change.
func rewrite(t *testing.T, dir, name string, b []byte) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
		t.Fatal(err)
	}
	m := readManifest(t, dir)
	sum := sha256.Sum256(b)
	m.SHA256[name] = hex.EncodeToString(sum[:])
	writeManifest(t, dir, m)
}

func editFile(t *testing.T, dir, name string, edit func([]byte) []byte) {
	t.Helper()
	p := filepath.Join(dir, name)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, edit(b), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestReadDirTampered(t *testing.T) {
	const n, dim = 20, 3
	tests := []struct {
		name    string
		tamper  func(t *testing.T, dir string)
		opts    []ReadOption
		wantErr error
	}{
		{"flipped feature byte", func(t *testing.T, dir string) {
			editFile(t, dir, featuresFile, func(b []byte) []byte { b[37] ^= 1; return b })
		}, nil, ErrChecksum},
		{"flipped label byte", func(t *testing.T, dir string) {
			editFile(t, dir, labelsFile, func(b []byte) []byte { b[3] ^= 0x80; return b })
		}, nil, ErrChecksum},
		{"truncated features", func(t *testing.T, dir string) {
			editFile(t, dir, featuresFile, func(b []byte) []byte { return b[:len(b)-4] })
		}, nil, ErrSize},
		{"extended labels", func(t *testing.T, dir string) {
			editFile(t, dir, labelsFile, func(b []byte) []byte { return append(b, 0) })
		}, nil, ErrSize},
		{"count mismatch", func(t *testing.T, dir string) {
			m := readManifest(t, dir)
			m.NumExamples++
			writeManifest(t, dir, m)
		}, nil, ErrSize},
		{"dim mismatch", func(t *testing.T, dir string) {
			m := readManifest(t, dir)
			m.Dim = 4
			writeManifest(t, dir, m)
		}, nil, ErrSize},
		{"label out of range", func(t *testing.T, dir string) {
			b, _ := os.ReadFile(filepath.Join(dir, labelsFile))
			b[5] = 3
			rewrite(t, dir, labelsFile, b)
		}, nil, ErrInvalidDataset},
		{"NaN feature", func(t *testing.T, dir string) {
			b, _ := os.ReadFile(filepath.Join(dir, featuresFile))
			binary.LittleEndian.PutUint32(b[8:], math.Float32bits(float32(math.NaN())))
			rewrite(t, dir, featuresFile, b)
		}, nil, ErrInvalidDataset},
		{"Inf feature", func(t *testing.T, dir string) {
			b, _ := os.ReadFile(filepath.Join(dir, featuresFile))
			binary.LittleEndian.PutUint32(b[len(b)-4:], math.Float32bits(float32(math.Inf(1))))
			rewrite(t, dir, featuresFile, b)
		}, nil, ErrInvalidDataset},
		{"garbled manifest", func(t *testing.T, dir string) {
			editFile(t, dir, ManifestFile, func(b []byte) []byte { return b[:len(b)/2] })
		}, nil, ErrManifest},
		{"manifest escapes directory", func(t *testing.T, dir string) {
			m := readManifest(t, dir)
			m.SHA256["../labels.u8"] = m.SHA256[m.Labels]
			delete(m.SHA256, m.Labels)
			m.Labels = "../labels.u8"
			writeManifest(t, dir, m)
		}, nil, ErrManifest},
		{"huge manifest", func(t *testing.T, dir string) {
			editFile(t, dir, ManifestFile, func(b []byte) []byte { return append(b, bytes.Repeat([]byte(" "), maxManifestBytes)...) })
		}, nil, ErrTooLarge},
		{"data file is a directory", func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, labelsFile)); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(filepath.Join(dir, labelsFile), 0o700); err != nil {
				t.Fatal(err)
			}
		}, nil, ErrManifest},
		{"missing features", func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, featuresFile)); err != nil {
				t.Fatal(err)
			}
		}, nil, fs.ErrNotExist},
		{"missing manifest", func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, ManifestFile)); err != nil {
				t.Fatal(err)
			}
		}, nil, fs.ErrNotExist},
		{"too many examples", func(*testing.T, string) {}, []ReadOption{WithMaxExamples(n - 1)}, ErrTooLarge},
		{"too many bytes", func(*testing.T, string) {}, []ReadOption{WithMaxBytes(n*dim*4 + n - 1)}, ErrTooLarge},
		{"negative limit", func(*testing.T, string) {}, []ReadOption{WithMaxBytes(-1)}, ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := WriteDir(dir, randomDataset(n, dim, 3, 4), "victim"); err != nil {
				t.Fatal(err)
			}
			tt.tamper(t, dir)
			d, err := ReadDir(dir, tt.opts...)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("ReadDir error = %v, want %v", err, tt.wantErr)
			}
			if d != nil {
				t.Error("dataset returned with error")
			}
		})
	}
}

func TestReadDirLimitsInclusive(t *testing.T) {
	const n, dim = 20, 3
	dir := t.TempDir()
	if err := WriteDir(dir, randomDataset(n, dim, 3, 4), "exact"); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadDir(dir, WithMaxExamples(n), WithMaxBytes(n*dim*4+n)); err != nil {
		t.Fatalf("ReadDir at exactly the limits: %v", err)
	}
}

func TestReadDirSymlinkEscape(t *testing.T) {
	outside := t.TempDir()
	dir := t.TempDir()
	d := randomDataset(5, 2, 2, 1)
	if err := WriteDir(outside, d, "outside"); err != nil {
		t.Fatal(err)
	}
	if err := WriteDir(dir, d, "inside"); err != nil {
		t.Fatal(err)
	}
	// Identical content, so only the escape itself can be the error.
	target := filepath.Join(outside, featuresFile)
	link := filepath.Join(dir, featuresFile)
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, link); err != nil {
		t.Skipf("symlinks unavailable: %v", err)
	}
	if _, err := ReadDir(dir); err == nil {
		t.Fatal("ReadDir followed a symlink out of the dataset directory")
	}
}

func validManifest() Manifest {
	return Manifest{
		Format:      FormatV1,
		Name:        "client-3",
		NumExamples: 10,
		Dim:         784,
		NumClasses:  10,
		Features:    featuresFile,
		Labels:      labelsFile,
		SHA256: map[string]string{
			featuresFile: strings.Repeat("ab", 32),
			labelsFile:   strings.Repeat("0f", 32),
		},
	}
}

func TestDecodeManifest(t *testing.T) {
	enc := func(edit func(m map[string]any)) []byte {
		b, _ := json.Marshal(validManifest())
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		edit(m)
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	set := func(k string, v any) []byte { return enc(func(m map[string]any) { m[k] = v }) }
	sums := func(kv ...string) map[string]string {
		out := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			out[kv[i]] = kv[i+1]
		}
		return out
	}
	hex64 := strings.Repeat("a", 64)

	got, err := DecodeManifest(enc(func(map[string]any) {}))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, validManifest()) {
		t.Errorf("DecodeManifest = %+v", got)
	}
	if _, err := DecodeManifest(set("features", "x.bin")); !errors.Is(err, ErrManifest) {
		t.Error("features renamed without its digest accepted")
	}
	renamed := enc(func(m map[string]any) {
		m["features"] = "x.bin"
		m["sha256"] = sums("x.bin", hex64, labelsFile, hex64)
	})
	if _, err := DecodeManifest(renamed); err != nil {
		t.Errorf("custom file names rejected: %v", err)
	}
	if _, err := DecodeManifest(set("num_examples", 0)); err != nil {
		t.Errorf("empty dataset rejected: %v", err)
	}

	tests := []struct {
		name    string
		in      []byte
		wantErr error
	}{
		{"empty", nil, ErrManifest},
		{"not JSON", []byte("manifest"), ErrManifest},
		{"null", []byte("null"), ErrManifest},
		{"array", []byte("[]"), ErrManifest},
		{"trailing data", append(enc(func(map[string]any) {}), []byte(" {}")...), ErrManifest},
		{"unknown field", set("extra", 1), ErrManifest},
		{"wrong format", set("format", "fleetlearn-dataset/v2"), ErrManifest},
		{"missing format", enc(func(m map[string]any) { delete(m, "format") }), ErrManifest},
		{"empty name", set("name", ""), ErrManifest},
		{"long name", set("name", strings.Repeat("x", 257)), ErrManifest},
		{"control in name", set("name", "a\x00b"), ErrManifest},
		{"negative examples", set("num_examples", -1), ErrManifest},
		{"fractional examples", set("num_examples", 1.5), ErrManifest},
		{"string examples", set("num_examples", "10"), ErrManifest},
		{"dim 0", set("dim", 0), ErrManifest},
		{"classes 0", set("num_classes", 0), ErrManifest},
		{"classes 257", set("num_classes", 257), ErrManifest},
		{"overflowing size", enc(func(m map[string]any) { m["num_examples"] = math.MaxInt64 / 8; m["dim"] = 4 }), ErrTooLarge},
		{"parent features", set("features", "../features.f32"), ErrManifest},
		{"absolute labels", set("labels", "/etc/passwd"), ErrManifest},
		{"nested features", set("features", "a/features.f32"), ErrManifest},
		{"backslash features", set("features", `a\features.f32`), ErrManifest},
		{"dot labels", set("labels", "."), ErrManifest},
		{"manifest as labels", set("labels", ManifestFile), ErrManifest},
		{"empty features", set("features", ""), ErrManifest},
		{"same files", enc(func(m map[string]any) {
			m["labels"] = featuresFile
			m["sha256"] = sums(featuresFile, hex64, "other", hex64)
		}), ErrManifest},
		{"missing digest", set("sha256", sums(featuresFile, hex64)), ErrManifest},
		{"extra digest", set("sha256", sums(featuresFile, hex64, labelsFile, hex64, "x", hex64)), ErrManifest},
		{"wrong digest key", set("sha256", sums(featuresFile, hex64, "labels.bin", hex64)), ErrManifest},
		{"uppercase digest", set("sha256", sums(featuresFile, strings.ToUpper(hex64), labelsFile, hex64)), ErrManifest},
		{"short digest", set("sha256", sums(featuresFile, hex64[:62], labelsFile, hex64)), ErrManifest},
		{"non-hex digest", set("sha256", sums(featuresFile, "zz"+hex64[2:], labelsFile, hex64)), ErrManifest},
		{"null digests", set("sha256", nil), ErrManifest},
		{"too large", append(enc(func(map[string]any) {}), bytes.Repeat([]byte(" "), maxManifestBytes)...), ErrTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := DecodeManifest(tt.in); !errors.Is(err, tt.wantErr) {
				t.Fatalf("DecodeManifest error = %v, want %v", err, tt.wantErr)
			}
		})
	}
}

func FuzzDecodeManifest(f *testing.F) {
	good, err := json.Marshal(validManifest())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte(`{"format":"fleetlearn-dataset/v1","name":"x","num_examples":0,"dim":1,"num_classes":1,` +
		`"features":"f","labels":"l","sha256":{"f":"` + strings.Repeat("0", 64) + `","l":"` + strings.Repeat("1", 64) + `"}}`))
	f.Add([]byte(`{"format":"fleetlearn-dataset/v1","features":"../x"}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, in []byte) {
		m, err := DecodeManifest(in)
		if err != nil {
			if !errors.Is(err, ErrManifest) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			return
		}
		if m.featureBytes() < 0 || m.labelBytes() < 0 || m.featureBytes()/4/int64(m.Dim) != int64(m.NumExamples) {
			t.Fatalf("sizes overflow: %+v", m)
		}
		for _, name := range []string{m.Features, m.Labels} {
			if !filepath.IsLocal(name) || strings.ContainsAny(name, `/\`) {
				t.Fatalf("accepted file name %q", name)
			}
		}
		// What was accepted must survive re-encoding unchanged.
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		again, err := DecodeManifest(b)
		if err != nil {
			t.Fatalf("re-encoded manifest rejected: %v", err)
		}
		if !reflect.DeepEqual(m, again) {
			t.Fatalf("round trip changed %+v to %+v", m, again)
		}
	})
}

func BenchmarkReadDir(b *testing.B) {
	dir := b.TempDir()
	if err := WriteDir(dir, randomDataset(6000, 784, 10, 1), "bench"); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := ReadDir(dir); err != nil {
			b.Fatal(err)
		}
	}
}
