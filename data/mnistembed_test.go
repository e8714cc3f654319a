package data

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"testing"
)

// The SHA-256 digests of the MNIST files as published, which the GoMNIST
// module's copies have; embedded/mnist/README.md lists them too.
var mnistDigests = map[string]string{
	mnistTrainImages: "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
	mnistTrainLabels: "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
	mnistTestImages:  "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
	mnistTestLabels:  "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
}

func readEmbedded(t *testing.T, name string) []byte {
	t.Helper()
	f, err := openMNISTFile(EmbeddedMNIST, name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestEmbeddedMNISTDigests(t *testing.T) {
	entries, err := fs.ReadDir(embeddedMNIST, embeddedMNISTDir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	want := slices.Clone(mnistFiles)
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Fatalf("embedded files %v, want %v", names, want)
	}
	for _, name := range mnistFiles {
		sum := sha256.Sum256(readEmbedded(t, name))
		if got := hex.EncodeToString(sum[:]); got != mnistDigests[name] {
			t.Errorf("embedded %s: sha256 %s, want %s", name, got, mnistDigests[name])
		}
	}
}

// The embedded copy must be the module's, byte for byte: the module cache
// copy is what builds with Go have always read.
func TestEmbeddedMNISTMatchesModule(t *testing.T) {
	var deps []*debug.Module
	if bi, ok := debug.ReadBuildInfo(); ok {
		deps = bi.Deps
	}
	// The module's own copy, whatever FLEETLEARN_MNIST_DIR says.
	getenv := func(k string) string {
		if k == MNISTDirEnv {
			return ""
		}
		return os.Getenv(k)
	}
	dir, err := findMNIST(getenv, goEnvModCache, deps)
	if errors.Is(err, ErrMNISTNotFound) {
		t.Skipf("cannot compare the embedded MNIST with %s: the module is not in the module cache (%v)", mnistModule, err)
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range mnistFiles {
		fromModule, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(readEmbedded(t, name), fromModule) {
			t.Errorf("embedded %s differs from %s", name, filepath.Join(dir, name))
		}
	}
}

func TestMNISTDirFallsBackToEmbedded(t *testing.T) {
	const pinned = "github.com/petar/!go!m!n!i!s!t@" + mnistVersion + "/data"
	cache := t.TempDir()
	inCache := fakeMNIST(t, cache, pinned)
	override := fakeMNIST(t, t.TempDir(), "x")
	empty := t.TempDir()
	noGo := func() (string, error) { return "", errors.New("no go command") }

	for _, tt := range []struct {
		name    string
		env     map[string]string
		want    string
		wantErr bool
	}{
		{name: "override first", env: map[string]string{MNISTDirEnv: override, "GOMODCACHE": cache}, want: override},
		{name: "module cache next", env: map[string]string{"GOMODCACHE": cache}, want: inCache},
		{name: "no Go, no module cache", env: map[string]string{"HOME": empty}, want: EmbeddedMNIST},
		{name: "empty module cache", env: map[string]string{"GOMODCACHE": empty, "HOME": empty}, want: EmbeddedMNIST},
		// A directory the operator named and got wrong is an error, not a
		// silent switch to other data.
		{name: "bad override", env: map[string]string{MNISTDirEnv: empty}, wantErr: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := mnistDir(func(k string) string { return tt.env[k] }, noGo, nil)
			if tt.wantErr {
				if !errors.Is(err, ErrMNISTNotFound) {
					t.Fatalf("mnistDir = %q, %v; want ErrMNISTNotFound", got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("mnistDir = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestLoadEmbeddedMNIST(t *testing.T) {
	// The labels alone are quick to read and parse.
	labels, err := readIDXFile(EmbeddedMNIST, mnistTestLabels, []int{mnistTestN})
	if err != nil {
		t.Fatal(err)
	}
	if want := []uint8{7, 2, 1, 0, 4, 1, 4, 9, 5, 9}; !slices.Equal(labels[:10], want) {
		t.Errorf("first test labels %v, want %v", labels[:10], want)
	}
	if _, err := readIDXFile(EmbeddedMNIST, "no-such-file.gz", []int{1}); !errors.Is(err, ErrMNISTNotFound) {
		t.Errorf("missing embedded file: %v, want ErrMNISTNotFound", err)
	}
	if testing.Short() {
		t.Skip("decompresses all of MNIST")
	}
	train, test, err := LoadMNIST(EmbeddedMNIST)
	if err != nil {
		t.Fatal(err)
	}
	if train.Len() != mnistTrainN || test.Len() != mnistTestN || train.Dim != mnistDim || train.NumClasses != mnistClasses {
		t.Fatalf("train %d, test %d examples, dim %d, %d classes", train.Len(), test.Len(), train.Dim, train.NumClasses)
	}
	if want := []uint8{5, 0, 4, 1, 9, 2, 1, 3, 1, 4}; !slices.Equal(train.Labels[:10], want) {
		t.Errorf("first training labels %v, want %v", train.Labels[:10], want)
	}
}
