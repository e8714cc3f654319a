// Package testtool finds the third-party programs that some tests run
// against Fleetlearn — the official nats CLI, the kubelet's probe code and a
// whole Kubernetes control plane (etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, KWOK, JobSet and Kueue) — built
// ahead of time from the modules pinned under testdata.
//
// Building them downloads and compiles hundreds of modules: minutes on a
// fresh machine. Done inside a test, that time counts against the package's
// go test timeout and depends on a warm module cache. So `go run
// ./internal/testtool/build` (which .ci/run runs before go test) builds each
// tool once into a cache keyed by its pinned sources and the Go version, and
// a test only looks it up: outside CI a missing tool skips the test with the
// command that builds it; under CI it fails. Files that a tool's tests need
// from its module (CRDs, manifests) are copied beside the binary, because
// the tests may run with an empty module cache.
package testtool

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
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
	// Static builds without cgo, with -trimpath and without symbol tables
	// or debug information (-ldflags=-s -w): a self-contained binary,
	// which for the control plane's large commands saves link time and
	// cache space.
	Static bool
	// VersionVar, when set, names a string variable (import path, a dot,
	// the name) that the build sets with -X to the version of the module
	// providing Pkg, as a release build does; kube-apiserver reports its
	// own at /version, which clients such as Kueue read.
	VersionVar string
	// Files are paths, slash-separated and relative to the root of the
	// module that provides Pkg, of files or directories that tests read
	// from that module (CRDs, manifests). The build copies them into
	// FilesDir; tests must not read them from the module cache, which may
	// be empty when they run.
	Files []string
}

// controlPlane is the directory of the control plane's pinned modules.
const controlPlane = "server/internal/kube/testdata/controlplane/"

var (
	// NATS is the official nats CLI (github.com/nats-io/natscli).
	NATS = Tool{Name: "nats", Dir: "cli/testdata/natscli", Pkg: "github.com/nats-io/natscli/nats",
		About: "the official nats CLI"}
	// KubeProbe runs one kubelet probe with the kubelet's own code.
	KubeProbe = Tool{Name: "kubeprobe", Dir: "deploy/testdata/kubeprobe", Pkg: ".",
		About: "the kubelet's probe code (k8s.io/kubernetes)"}

	// Etcd is etcd at the version k8s.io/kubernetes requires.
	Etcd = Tool{Name: "etcd", Dir: controlPlane + "etcd", Pkg: ".", Static: true,
		About: "etcd (go.etcd.io/etcd/server/v3)"}
	// KubeAPIServer is kube-apiserver from k8s.io/kubernetes.
	KubeAPIServer = Tool{Name: "kube-apiserver", Dir: controlPlane + "kubernetes", Pkg: "k8s.io/kubernetes/cmd/kube-apiserver",
		Static: true, VersionVar: kubeVersionVar, About: "kube-apiserver (k8s.io/kubernetes)"}
	// KubeControllerManager runs the Job, garbage collector and other
	// built-in controllers.
	KubeControllerManager = Tool{Name: "kube-controller-manager", Dir: controlPlane + "kubernetes",
		Pkg: "k8s.io/kubernetes/cmd/kube-controller-manager", Static: true, VersionVar: kubeVersionVar,
		About: "kube-controller-manager (k8s.io/kubernetes)"}
	// KubeScheduler binds pods to nodes.
	KubeScheduler = Tool{Name: "kube-scheduler", Dir: controlPlane + "kubernetes", Pkg: "k8s.io/kubernetes/cmd/kube-scheduler",
		Static: true, VersionVar: kubeVersionVar, About: "kube-scheduler (k8s.io/kubernetes)"}
	// KWOK fakes nodes and the lifecycle of the pods bound to them, without
	// a container runtime; its stages say how.
	KWOK = Tool{Name: "kwok", Dir: controlPlane + "kwok", Pkg: "sigs.k8s.io/kwok/cmd/kwok", Static: true,
		About: "KWOK (sigs.k8s.io/kwok)", Files: []string{
			"kustomize/stage/node/fast/node-initialize.yaml",
			"kustomize/stage/node/heartbeat/node-heartbeat.yaml",
			"kustomize/stage/pod/fast/pod-ready.yaml",
			"kustomize/stage/pod/fast/pod-delete.yaml",
		}}
	// JobSet is the JobSet controller manager, with its CRD and webhook
	// configurations.
	JobSet = Tool{Name: "jobset", Dir: controlPlane + "jobset", Pkg: "sigs.k8s.io/jobset", Static: true,
		About: "the JobSet controller (sigs.k8s.io/jobset)", Files: controllerFiles}
	// Kueue is the Kueue controller manager, with its CRDs and webhook
	// configurations.
	Kueue = Tool{Name: "kueue", Dir: controlPlane + "kueue", Pkg: "sigs.k8s.io/kueue/cmd/kueue", Static: true,
		About: "the Kueue controller (sigs.k8s.io/kueue)", Files: controllerFiles}
)

// kubeVersionVar holds the version that Kubernetes commands report.
const kubeVersionVar = "k8s.io/component-base/version.gitVersion"

// controllerFiles are where the JobSet and Kueue modules keep their CRDs
// and the webhook configurations their controllers serve.
var controllerFiles = []string{"config/components/crd/bases", "config/components/webhook/manifests.yaml"}

// ControlPlane is the Kubernetes control plane that package kubetest runs,
// in the order it starts it.
var ControlPlane = []Tool{Etcd, KubeAPIServer, KubeControllerManager, KubeScheduler, KWOK, JobSet, Kueue}

// All is every tool, in the order the build command builds them.
var All = append([]Tool{NATS, KubeProbe}, ControlPlane...)

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
// directory, the Go version, the target platform and how t is built. A
// changed pin gives a new key, so a stale binary is never used.
func (t Tool) Key(root string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s/%s\x00%s\x00", runtime.Version(), runtime.GOOS, runtime.GOARCH, t.Pkg)
	// Hashed only when set, so that the keys of tools that set none of
	// them stay as they were, and so do their built binaries.
	if t.Static || t.VersionVar != "" || len(t.Files) > 0 {
		fmt.Fprintf(h, "static=%t\x00version=%s\x00files=%q\x00", t.Static, t.VersionVar, t.Files)
	}
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

// FilesDir is where the build puts the tool's Files, given its binary's
// path: each under its path relative to the module's root.
func FilesDir(bin string) string { return bin + ".files" }

// Build compiles t into its Path, with its Files in FilesDir, unless it is
// there already, and returns the path. The binary appears there only once
// complete, and after the files.
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
	dir := filepath.Join(root, filepath.FromSlash(t.Dir))
	// A go.work above the repository would not list the tool's module.
	env := append(os.Environ(), "GOWORK=off")
	if t.Static {
		env = append(env, "CGO_ENABLED=0")
	}
	var mod module
	if t.VersionVar != "" || len(t.Files) > 0 {
		if mod, err = t.module(ctx, dir, env); err != nil {
			return "", err
		}
	}
	tmp := bin + ".tmp" + fmt.Sprint(os.Getpid())
	defer os.Remove(tmp)
	args := []string{"build", "-o", tmp}
	var ldflags []string
	if t.Static {
		args = append(args, "-trimpath")
		ldflags = append(ldflags, "-s", "-w")
	}
	if t.VersionVar != "" {
		if mod.Version == "" {
			return "", fmt.Errorf("testtool: %s: %s has no version to set %s to", t.Name, mod.Path, t.VersionVar)
		}
		ldflags = append(ldflags, "-X", t.VersionVar+"="+mod.Version)
	}
	if len(ldflags) > 0 {
		args = append(args, "-ldflags="+strings.Join(ldflags, " "))
	}
	args = append(args, t.Pkg)
	cmd := exec.CommandContext(ctx, goCmd(), args...)
	cmd.Dir, cmd.Env = dir, env
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("testtool: go %s in %s: %w\n%s", strings.Join(args, " "), t.Dir, err, out)
	}
	if len(t.Files) > 0 {
		if err := t.copyFiles(mod.Dir, FilesDir(bin)); err != nil {
			return "", err
		}
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", fmt.Errorf("testtool: %w", err)
	}
	return bin, nil
}

func goCmd() string { return filepath.Join(runtime.GOROOT(), "bin", "go") }

// module is the module that provides a tool's Pkg.
type module struct{ Path, Version, Dir string }

func (t Tool) module(ctx context.Context, dir string, env []string) (module, error) {
	cmd := exec.CommandContext(ctx, goCmd(), "list", "-f", "{{with .Module}}{{.Path}}\t{{.Version}}\t{{.Dir}}{{end}}", t.Pkg)
	cmd.Dir, cmd.Env = dir, env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return module{}, fmt.Errorf("testtool: go list %s in %s: %w\n%s", t.Pkg, t.Dir, err, stderr.Bytes())
	}
	f := strings.Split(strings.TrimSpace(string(out)), "\t")
	if len(f) != 3 || f[2] == "" {
		return module{}, fmt.Errorf("testtool: go list %s in %s: no module directory in %q", t.Pkg, t.Dir, out)
	}
	return module{Path: f[0], Version: f[1], Dir: f[2]}, nil
}

// copyFiles copies t's Files from the module directory modDir into dst,
// which appears only once complete.
func (t Tool) copyFiles(modDir, dst string) error {
	tmp := dst + ".tmp" + fmt.Sprint(os.Getpid())
	defer os.RemoveAll(tmp)
	for _, f := range t.Files {
		if path.IsAbs(f) || !fs.ValidPath(f) {
			return fmt.Errorf("testtool: %s: file %q is not a path inside its module", t.Name, f)
		}
		src := filepath.Join(modDir, filepath.FromSlash(f))
		err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return err
			}
			rel, err := filepath.Rel(modDir, p)
			if err != nil {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out := filepath.Join(tmp, rel)
			if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
				return err
			}
			// The module cache's files are read-only; the copies need
			// not be.
			return os.WriteFile(out, b, 0o644)
		})
		if err != nil {
			return fmt.Errorf("testtool: %s: copy %s: %w", t.Name, f, err)
		}
	}
	// A copy left by a build that died before its binary appeared.
	if err := os.RemoveAll(dst); err != nil {
		return fmt.Errorf("testtool: %s: %w", t.Name, err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return fmt.Errorf("testtool: %s: %w", t.Name, err)
	}
	return nil
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
