// Package testtool finds the third-party programs that some tests run
// against Fleetlearn — the official nats CLI and the kubelet's probe code —
// built ahead of time from the modules pinned under testdata.
//
// Building them downloads and compiles hundreds of modules: minutes on a
// fresh machine. Done inside a test, that time counts against the package's
// go test timeout and depends on a warm module cache. So `go run
// ./internal/testtool/build` (which .ci/run runs before go test) builds each
// tool once into a cache keyed by its pinned sources and the Go version, and
// a test only looks it up: outside CI a missing tool skips the test with the
// command that builds it; under CI it fails.
package testtool

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// BuildCommand is what a person runs to build every tool.
const BuildCommand = "go run ./internal/testtool/build"

// Tool is a program built from a module of its own under testdata, so that
// its dependencies stay out of Fleetlearn's go.mod.
type Tool struct {
	// Name is the binary's name.
	Name string
	// Dir is the tool's module directory, relative to the repository root.
	Dir string
	// Pkg is the main package to build, as go build names it from Dir.
	Pkg string
	// About says what the tool is, for messages.
	About string
}

var (
	// NATS is the official nats CLI (github.com/nats-io/natscli).
	NATS = Tool{Name: "nats", Dir: "cli/testdata/natscli", Pkg: "github.com/nats-io/natscli/nats",
		About: "the official nats CLI"}
	// KubeProbe runs one kubelet probe with the kubelet's own code.
	KubeProbe = Tool{Name: "kubeprobe", Dir: "deploy/testdata/kubeprobe", Pkg: ".",
		About: "the kubelet's probe code (k8s.io/kubernetes)"}
)

// All is every tool, in the order the build command builds them.
var All = []Tool{NATS, KubeProbe}

// EnvDir names the directory that holds built tools; empty means
// CacheDir's default.
const EnvDir = "FLEETLEARN_TOOLS"

// CacheDir is where built tools live: $FLEETLEARN_TOOLS, or fleetlearn/tools
// under the user's cache directory.
func CacheDir() (string, error) {
	if d := os.Getenv(EnvDir); d != "" {
		return filepath.Abs(d)
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("testtool: no cache directory (set %s): %w", EnvDir, err)
	}
	return filepath.Join(d, "fleetlearn", "tools"), nil
}

// RepoRoot finds the repository root above dir: the directory whose go.mod
// declares the Fleetlearn module.
func RepoRoot(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && modulePath(b) == "github.com/fleetlearn/fleetlearn" {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("testtool: not inside the Fleetlearn repository")
		}
		dir = parent
	}
}

func modulePath(gomod []byte) string {
	for _, line := range strings.Split(string(gomod), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "module" {
			return f[1]
		}
	}
	return ""
}

// Key identifies one build of t: a digest of every file of its module
// directory, the Go version and the target platform. A changed pin gives a
// new key, so a stale binary is never used.
func (t Tool) Key(root string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s/%s\x00%s\x00", runtime.Version(), runtime.GOOS, runtime.GOARCH, t.Pkg)
	dir := filepath.Join(root, filepath.FromSlash(t.Dir))
	var files []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("testtool: %s: %w", t.Name, err)
	}
	slices.Sort(files)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", fmt.Errorf("testtool: %s: %w", t.Name, err)
		}
		rel, _ := filepath.Rel(dir, f)
		fmt.Fprintf(h, "%s\x00%d\x00", filepath.ToSlash(rel), len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// Path is where t's binary for this repository's pins is, or would be.
func (t Tool) Path(root string) (string, error) {
	dir, err := CacheDir()
	if err != nil {
		return "", err
	}
	key, err := t.Key(root)
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, t.Name+"-"+key), nil
}

// Build compiles t into its Path, unless it is there already, and returns
// the path. The binary appears there only once complete.
func (t Tool) Build(ctx context.Context, root string) (string, error) {
	bin, err := t.Path(root)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return "", fmt.Errorf("testtool: %w", err)
	}
	tmp := bin + ".tmp" + fmt.Sprint(os.Getpid())
	defer os.Remove(tmp)
	cmd := exec.CommandContext(ctx, filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", tmp, t.Pkg)
	cmd.Dir = filepath.Join(root, filepath.FromSlash(t.Dir))
	// A go.work above the repository would not list the tool's module.
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("testtool: go build %s in %s: %w\n%s", t.Pkg, t.Dir, err, out)
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", fmt.Errorf("testtool: %w", err)
	}
	return bin, nil
}

// Find returns t's binary for the test. When it has not been built, the
// test skips with the command that builds it, or fails under CI
// (CI set in the environment), where .ci/run builds every tool first.
func Find(tb testing.TB, t Tool) string {
	tb.Helper()
	root, err := RepoRoot(".")
	if err != nil {
		tb.Fatal(err)
	}
	bin, err := t.Path(root)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	msg := fmt.Sprintf("needs %s, built from %s: run `%s` in the repository first (once; it downloads and compiles its modules), or set %s to where it put them",
		t.About, t.Dir, BuildCommand, EnvDir)
	if os.Getenv("CI") != "" {
		tb.Fatal(msg + " (CI is set: .ci/run builds the tools before go test)")
	}
	tb.Skip(msg)
	return ""
}
