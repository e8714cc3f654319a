// Command release builds Fleetlearn's release binaries for every platform
// the fleet runs on:
//
//	go run ./deploy/release                      # all of ./cmd, linux/amd64, linux/arm64, linux/arm/v7
//	go run ./deploy/release -platforms linux/arm64 -cmds fleetlearn-edge
//	go run ./deploy/release -print version       # the version it would stamp
//
// It writes DIST/<os>-<arch>[<variant>]/<binary> (dist/linux-amd64,
// dist/linux-arm64, dist/linux-armv7) and DIST/SHA256SUMS, which
// `cd dist && sha256sum -c SHA256SUMS` checks.
//
// The binaries are static (CGO_ENABLED=0; SQLite and wazero are pure Go),
// built with -trimpath, stripped, and stamped with -ldflags -X with the
// version, the commit and its time (internal/version), which `version`
// prints. The build is reproducible: everything that goes into it is the
// source, the Go toolchain and the flags here; no path, host, user or
// build time. The environment cannot change it either: GOFLAGS,
// GOEXPERIMENT and the per-architecture levels (GOAMD64, GOARM64, GOARM)
// are set, not inherited. Two builds of one commit with one Go release
// give the same SHA256SUMS.
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"debug/buildinfo"
	"debug/elf"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
)

// modulePath is the module the release is built from.
const modulePath = "github.com/fleetlearn/fleetlearn"

// versionPkg holds the link-time stamps.
const versionPkg = modulePath + "/internal/version"

// defaultPlatforms are where agents and servers run: x86-64 servers and
// gateways, 64-bit ARM boards and servers, and 32-bit ARMv7 boards.
const defaultPlatforms = "linux/amd64,linux/arm64,linux/arm/v7"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		var u usageError
		if errors.As(err, &u) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// usageError is an error of the command line.
type usageError struct{ error }

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("release", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	dist := fs.String("dist", "dist", "output `directory`; each platform's directory in it is replaced")
	platforms := fs.String("platforms", defaultPlatforms, "comma-separated `os/arch[/variant]` list, as docker --platform names them")
	cmds := fs.String("cmds", "", "comma-separated commands of ./cmd to build (default: all)")
	ver := fs.String("version", "", "version to stamp (default: the tag at HEAD, else a Go pseudo-version of HEAD; +dirty for a modified tree)")
	commit := fs.String("commit", "", "commit to stamp (default: git rev-parse HEAD; +dirty for a modified tree)")
	commitTime := fs.String("commit-time", "", "commit time to stamp, RFC 3339 (default: HEAD's committer time)")
	printStamp := fs.String("print", "", "print one stamp (version, commit or commit-time) and build nothing, for docker build --build-arg")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stdout)
			fmt.Fprintln(stdout, "usage: go run ./deploy/release [flags]")
			fs.PrintDefaults()
			return nil
		}
		return usageError{fmt.Errorf("%w; run 'go run ./deploy/release -h' for usage", err)}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q: release takes flags only; run 'go run ./deploy/release -h' for usage", fs.Arg(0))}
	}
	root, err := moduleRoot(ctx)
	if err != nil {
		return err
	}
	st, err := stampsFor(ctx, root, stamps{Version: *ver, Commit: *commit, CommitTime: *commitTime})
	if err != nil {
		return err
	}
	switch *printStamp {
	case "":
	case "version":
		_, err := fmt.Fprintln(stdout, st.Version)
		return err
	case "commit":
		_, err := fmt.Fprintln(stdout, st.Commit)
		return err
	case "commit-time":
		_, err := fmt.Fprintln(stdout, st.CommitTime)
		return err
	default:
		return usageError{fmt.Errorf("-print %q: want version, commit or commit-time", *printStamp)}
	}

	ps, err := parsePlatforms(*platforms)
	if err != nil {
		return usageError{err}
	}
	all, err := commands(ctx, root)
	if err != nil {
		return err
	}
	names := all
	if *cmds != "" {
		names = nil
		for _, c := range strings.Split(*cmds, ",") {
			if !slices.Contains(all, c) {
				return usageError{fmt.Errorf("-cmds: no command %q in ./cmd; there are %s", c, strings.Join(all, ", "))}
			}
			names = append(names, c)
		}
	}
	goVersion, err := goOutput(ctx, root, nil, "env", "GOVERSION")
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "fleetlearn %s, commit %s, built with %s\n", st.Version, st.Commit, goVersion)

	distAbs, err := filepath.Abs(*dist)
	if err != nil {
		return fmt.Errorf("-dist: %w", err)
	}
	var built []string // relative to distAbs
	for _, p := range ps {
		out := filepath.Join(distAbs, p.dir())
		if err := os.RemoveAll(out); err != nil {
			return fmt.Errorf("clearing %s: %w", out, err)
		}
		if err := os.MkdirAll(out, 0o755); err != nil {
			return fmt.Errorf("creating %s: %w", out, err)
		}
		start := time.Now()
		if err := build(ctx, root, p, st, out, names); err != nil {
			return err
		}
		for _, n := range names {
			bin := filepath.Join(out, n)
			if err := check(bin, p, st, root); err != nil {
				return err
			}
			fi, err := os.Stat(bin)
			if err != nil {
				return fmt.Errorf("%s: %w", bin, err)
			}
			fmt.Fprintf(stdout, "%-14s %-20s %10d bytes %6.1f MiB\n", p, n, fi.Size(), float64(fi.Size())/(1<<20))
			built = append(built, filepath.ToSlash(filepath.Join(p.dir(), n)))
		}
		fmt.Fprintf(stdout, "%-14s built in %v\n", p, time.Since(start).Round(100*time.Millisecond))
	}
	sums, err := sha256Sums(distAbs, built)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(filepath.Join(distAbs, "SHA256SUMS"), sums); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s\n", filepath.Join(*dist, "SHA256SUMS"))
	return nil
}

// platform is one build target.
type platform struct {
	OS, Arch, Variant string
}

func (p platform) String() string {
	if p.Variant == "" {
		return p.OS + "/" + p.Arch
	}
	return p.OS + "/" + p.Arch + "/" + p.Variant
}

// dir is the platform's directory in dist: linux-amd64, linux-armv7.
func (p platform) dir() string { return p.OS + "-" + p.Arch + p.Variant }

// env is the target part of the go command's environment. Every level
// is given, default or not, so that the caller's environment cannot pick
// another one.
func (p platform) env() []string {
	e := []string{"GOOS=" + p.OS, "GOARCH=" + p.Arch}
	switch p.Arch {
	case "amd64":
		e = append(e, "GOAMD64="+orDefault(p.Variant, "v1"))
	case "arm64":
		// Docker calls ARMv8.0 "v8"; Go calls it "v8.0".
		e = append(e, "GOARM64="+map[string]string{"": "v8.0", "v8": "v8.0"}[p.Variant])
	case "arm":
		e = append(e, "GOARM="+strings.TrimPrefix(p.Variant, "v"))
	}
	return e
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// parsePlatforms reads -platforms. 32-bit arm needs its variant (v6 or v7:
// a v7 build does not run on a v6 board); linux/arm alone means v7, as in
// Docker.
func parsePlatforms(s string) ([]platform, error) {
	var ps []platform
	for _, f := range strings.Split(s, ",") {
		parts := strings.Split(strings.TrimSpace(f), "/")
		if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
			return nil, fmt.Errorf("-platforms: %q: want os/arch or os/arch/variant, such as linux/arm64 or linux/arm/v7", f)
		}
		p := platform{OS: parts[0], Arch: parts[1]}
		if len(parts) == 3 {
			p.Variant = parts[2]
		}
		if p.OS != "linux" {
			return nil, fmt.Errorf("-platforms: %s: only linux is released (the agents' health checks and sandboxes are tested there)", p)
		}
		switch p.Arch {
		case "amd64":
			if !slices.Contains([]string{"", "v1", "v2", "v3", "v4"}, p.Variant) {
				return nil, fmt.Errorf("-platforms: %s: amd64 variants are v1 to v4", p)
			}
		case "arm64":
			if p.Variant != "" && p.Variant != "v8" {
				return nil, fmt.Errorf("-platforms: %s: the arm64 variant is v8", p)
			}
		case "arm":
			if p.Variant == "" {
				p.Variant = "v7"
			}
			if p.Variant != "v6" && p.Variant != "v7" {
				return nil, fmt.Errorf("-platforms: %s: arm variants are v6 and v7", p)
			}
		default:
			return nil, fmt.Errorf("-platforms: %s: the release builds for amd64, arm64 and arm (v6, v7)", p)
		}
		if slices.Contains(ps, p) {
			return nil, fmt.Errorf("-platforms: %s given twice", p)
		}
		ps = append(ps, p)
	}
	return ps, nil
}

// stamps are what the binaries' version commands print.
type stamps struct {
	Version, Commit, CommitTime string
}

// ldflags strips the symbol table and DWARF (-s -w: a third of an agent's
// size, and panics still print file:line) and stamps st.
func (st stamps) ldflags() string {
	return strings.Join([]string{"-s", "-w",
		"-X", versionPkg + ".Version=" + st.Version,
		"-X", versionPkg + ".Commit=" + st.Commit,
		"-X", versionPkg + ".CommitTime=" + st.CommitTime,
	}, " ")
}

// stampsFor fills what given leaves empty from git. The tree counts as
// modified, as for Go's own VCS stamping, when git status lists anything:
// such a build is not the commit it names.
func stampsFor(ctx context.Context, root string, given stamps) (stamps, error) {
	st := given
	for _, v := range []string{st.Version, st.Commit, st.CommitTime} {
		if strings.ContainsAny(v, " \t\n'\"") {
			return st, usageError{fmt.Errorf("stamp %q contains a space or a quote: -ldflags -X cannot carry it", v)}
		}
	}
	if st.Version != "" && st.Commit != "" && st.CommitTime != "" {
		return st, nil
	}
	git := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Dir = root
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("git %s: %w: %s\n(build from a git checkout, or give -version, -commit and -commit-time)",
				strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
		}
		return strings.TrimSpace(string(out)), nil
	}
	rev, err := git("rev-parse", "HEAD")
	if err != nil {
		return st, err
	}
	status, err := git("status", "--porcelain")
	if err != nil {
		return st, err
	}
	dirty := ""
	if status != "" {
		dirty = "+dirty"
	}
	ct, err := git("log", "-1", "--format=%ct", "HEAD")
	if err != nil {
		return st, err
	}
	sec, err := strconv.ParseInt(ct, 10, 64)
	if err != nil {
		return st, fmt.Errorf("git log: commit time %q: %w", ct, err)
	}
	t := time.Unix(sec, 0).UTC()
	if st.Commit == "" {
		st.Commit = rev + dirty
	}
	if st.CommitTime == "" {
		st.CommitTime = t.Format(time.RFC3339)
	}
	if st.Version == "" {
		tags, err := git("tag", "--points-at", "HEAD", "--list", "v*")
		if err != nil {
			return st, err
		}
		older := ""
		if d, err := git("describe", "--tags", "--abbrev=0", "--match", "v[0-9]*", "HEAD"); err == nil {
			older = d
		}
		st.Version = versionFrom(strings.Fields(tags), older, t, rev) + dirty
	}
	return st, nil
}

// versionFrom is the version Go's own VCS stamping gives a build of
// commit rev made at t: the highest release tag at it, else a
// pseudo-version after the nearest tag before it (older), as `go get`
// would name the commit.
func versionFrom(tagsAtHead []string, older string, t time.Time, rev string) string {
	best := ""
	for _, tag := range tagsAtHead {
		if semver.IsValid(tag) && semver.Build(tag) == "" && (semver.Major(tag) == "v0" || semver.Major(tag) == "v1") &&
			(best == "" || semver.Compare(tag, best) > 0) {
			best = tag
		}
	}
	if best != "" {
		return best
	}
	if !semver.IsValid(older) || semver.Build(older) != "" || (semver.Major(older) != "v0" && semver.Major(older) != "v1") {
		older = ""
	}
	// Go names the commit by its first 12 hex digits.
	if len(rev) > 12 {
		rev = rev[:12]
	}
	return module.PseudoVersion("", older, t, rev)
}

// moduleRoot is the directory of the module's go.mod.
func moduleRoot(ctx context.Context) (string, error) {
	gomod, err := goOutput(ctx, "", nil, "env", "GOMOD")
	if err != nil {
		return "", err
	}
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("not in a module: run the release from the Fleetlearn source tree (go run ./deploy/release)")
	}
	root := filepath.Dir(gomod)
	mod, err := goOutput(ctx, root, nil, "list", "-m")
	if err != nil {
		return "", err
	}
	if mod != modulePath {
		return "", fmt.Errorf("%s is module %s, not %s: run the release from the Fleetlearn source tree", gomod, mod, modulePath)
	}
	return root, nil
}

// commands are the names of the commands in ./cmd.
func commands(ctx context.Context, root string) ([]string, error) {
	out, err := goOutput(ctx, root, nil, "list", "-f", "{{if eq .Name \"main\"}}{{.ImportPath}}{{end}}", "./cmd/...")
	if err != nil {
		return nil, err
	}
	var names []string
	for _, l := range strings.Fields(out) {
		names = append(names, l[strings.LastIndex(l, "/")+1:])
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("no commands in %s/cmd", root)
	}
	return names, nil
}

// buildEnv is the go command's environment for p: the caller's, less what
// would change the output, plus the target.
func buildEnv(p platform) []string {
	drop := []string{"GOOS", "GOARCH", "GOAMD64", "GOARM", "GOARM64", "GO386", "GOMIPS", "GOMIPS64", "GOPPC64",
		"GORISCV64", "GOWASM", "CGO_ENABLED", "GOFLAGS", "GOEXPERIMENT"}
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if !slices.Contains(drop, k) {
			env = append(env, kv)
		}
	}
	// -mod=readonly: the release builds what go.mod and go.sum say, or fails.
	return append(append(env, "CGO_ENABLED=0", "GOFLAGS=-mod=readonly", "GOEXPERIMENT="), p.env()...)
}

// build runs one go build for p, of every command in names, into out.
func build(ctx context.Context, root string, p platform, st stamps, out string, names []string) error {
	args := []string{"build", "-trimpath", "-buildvcs=false", "-ldflags=" + st.ldflags(), "-o", out + string(os.PathSeparator)}
	for _, n := range names {
		args = append(args, "./cmd/"+n)
	}
	cmd := exec.CommandContext(ctx, goCommand(), args...)
	cmd.Dir = root
	cmd.Env = buildEnv(p)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build for %s: %w\n%s", p, err, b)
	}
	return nil
}

// elfMachine is the ELF machine of each architecture.
var elfMachine = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64, "arm": elf.EM_ARM}

// check reads back what a binary is: its ELF machine, static linking, and
// the build settings and stamps Go recorded in it; and that no path of
// the build machine is in it. A release must not ship a binary for the
// wrong board, or one a stray environment variable changed.
func check(bin string, p platform, st stamps, root string) error {
	f, err := elf.Open(bin)
	if err != nil {
		return fmt.Errorf("%s: not an ELF binary: %w", bin, err)
	}
	machine := f.Machine
	interp := f.Section(".interp") != nil || slices.ContainsFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP })
	f.Close()
	if machine != elfMachine[p.Arch] {
		return fmt.Errorf("%s: ELF machine %v, want %v for %s", bin, machine, elfMachine[p.Arch], p)
	}
	if interp {
		return fmt.Errorf("%s: dynamically linked; the release must be static (CGO_ENABLED=0)", bin)
	}
	bi, err := buildinfo.ReadFile(bin)
	if err != nil {
		return fmt.Errorf("%s: reading its build information: %w", bin, err)
	}
	// With -trimpath Go records no -ldflags (they may hold paths): the
	// stamps are looked for in the bytes below.
	want := map[string]string{"GOOS": p.OS, "GOARCH": p.Arch, "CGO_ENABLED": "0", "-trimpath": "true"}
	for _, kv := range p.env()[2:] {
		k, v, _ := strings.Cut(kv, "=")
		want[k] = v
	}
	got := map[string]string{}
	for _, s := range bi.Settings {
		got[s.Key] = s.Value
	}
	for k, v := range want {
		if got[k] != v {
			return fmt.Errorf("%s: built with %s=%q, want %q", bin, k, got[k], v)
		}
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		return fmt.Errorf("%s: %w", bin, err)
	}
	if bytes.Contains(b, []byte(root+string(os.PathSeparator))) {
		return fmt.Errorf("%s: holds the source path %s; -trimpath did not apply", bin, root)
	}
	for _, v := range []string{st.Version, st.Commit, st.CommitTime} {
		if v != "" && !bytes.Contains(b, []byte(v)) {
			return fmt.Errorf("%s: the stamp %q is not in it: -ldflags -X %s did not apply", bin, v, versionPkg)
		}
	}
	return nil
}

// sha256Sums is the SHA256SUMS file for files (relative to dir), in the
// format sha256sum -c reads.
func sha256Sums(dir string, files []string) ([]byte, error) {
	slices.Sort(files)
	var buf bytes.Buffer
	for _, name := range files {
		f, err := os.Open(filepath.Join(dir, filepath.FromSlash(name)))
		if err != nil {
			return nil, err
		}
		h := sha256.New()
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("hashing %s: %w", name, err)
		}
		fmt.Fprintf(&buf, "%s  %s\n", hex.EncodeToString(h.Sum(nil)), name)
	}
	return buf.Bytes(), nil
}

// writeFileAtomic replaces name with b, so that a reader never sees half
// a SHA256SUMS.
func writeFileAtomic(name string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(name), ".SHA256SUMS-*")
	if err != nil {
		return err
	}
	_, err = tmp.Write(b)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), name)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("writing %s: %w", name, err)
	}
	return nil
}

// goCommand is the go command on PATH, else the one of the toolchain
// that built this program.
func goCommand() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

// goOutput runs the go command in dir and returns its trimmed standard
// output.
func goOutput(ctx context.Context, dir string, env []string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, goCommand(), args...)
	cmd.Dir = dir
	if env != nil {
		cmd.Env = env
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go %s: %w: %s (is the go command on PATH?)", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}
