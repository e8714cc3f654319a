package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/semver"
)

func TestParsePlatforms(t *testing.T) {
	ps, err := parsePlatforms(defaultPlatforms)
	if err != nil {
		t.Fatal(err)
	}
	var dirs, envs []string
	for _, p := range ps {
		dirs = append(dirs, p.dir())
		envs = append(envs, strings.Join(p.env(), " "))
	}
	if want := []string{"linux-amd64", "linux-arm64", "linux-armv7"}; !slices.Equal(dirs, want) {
		t.Errorf("dirs %v, want %v", dirs, want)
	}
	if want := []string{"GOOS=linux GOARCH=amd64 GOAMD64=v1", "GOOS=linux GOARCH=arm64 GOARM64=v8.0",
		"GOOS=linux GOARCH=arm GOARM=7"}; !slices.Equal(envs, want) {
		t.Errorf("environments %q, want %q", envs, want)
	}
	// Docker's names: linux/arm is v7, arm64/v8 is Go's v8.0.
	ps, err = parsePlatforms("linux/arm, linux/arm64/v8,linux/amd64/v3,linux/arm/v6")
	if err != nil {
		t.Fatal(err)
	}
	if got := []string{ps[0].String(), ps[1].env()[2], ps[2].env()[2], ps[3].env()[2]}; !slices.Equal(got,
		[]string{"linux/arm/v7", "GOARM64=v8.0", "GOAMD64=v3", "GOARM=6"}) {
		t.Errorf("got %q", got)
	}
	for _, bad := range []string{"", "linux", "linux/", "darwin/arm64", "linux/riscv64", "linux/arm/v5", "linux/amd64/v5",
		"linux/arm64/v9", "linux/arm64,linux/arm64", "linux/arm,linux/arm/v7", "linux/arm/v7/x"} {
		if _, err := parsePlatforms(bad); err == nil {
			t.Errorf("parsePlatforms(%q) accepted it", bad)
		}
	}
}

func TestVersionFrom(t *testing.T) {
	at := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	rev := "0123456789abcdef0123456789abcdef01234567"
	for _, c := range []struct {
		tags  []string
		older string
		want  string
	}{
		{nil, "", "v0.0.0-20250102030405-0123456789ab"},
		{nil, "v1.2.3", "v1.2.4-0.20250102030405-0123456789ab"},
		{nil, "v1.3.0-rc.1", "v1.3.0-rc.1.0.20250102030405-0123456789ab"},
		{[]string{"v1.2.3"}, "v1.2.3", "v1.2.3"},
		{[]string{"v1.2.3", "v1.10.0", "vbad"}, "v1.10.0", "v1.10.0"},
		// Neither a v2 tag (the module path has no /v2) nor a tag that is
		// not semantic is a release of this module.
		{[]string{"v2.0.0", "release-1"}, "v2.0.0", "v0.0.0-20250102030405-0123456789ab"},
	} {
		got := versionFrom(c.tags, c.older, at, rev)
		if got != c.want {
			t.Errorf("versionFrom(%q, %q) = %q, want %q", c.tags, c.older, got, c.want)
		}
		if !semver.IsValid(got) {
			t.Errorf("versionFrom(%q, %q) = %q is not a semantic version", c.tags, c.older, got)
		}
	}
}

// TestStampsFromGit: in a checkout, the stamps come from HEAD; what is
// given wins; what -ldflags -X cannot carry is refused.
func TestStampsFromGit(t *testing.T) {
	root, err := moduleRoot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git: the stamps come from -version, -commit and -commit-time")
	}
	if out, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").CombinedOutput(); err != nil {
		t.Skipf("not a git checkout (%v: %s): the stamps come from -version, -commit and -commit-time", err, out)
	}
	st, err := stampsFor(t.Context(), root, stamps{})
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^[0-9a-f]{40}(\+dirty)?$`).MatchString(st.Commit) {
		t.Errorf("commit %q", st.Commit)
	}
	if !semver.IsValid(st.Version) || strings.HasSuffix(st.Commit, "+dirty") != strings.HasSuffix(st.Version, "+dirty") {
		t.Errorf("version %q for commit %q", st.Version, st.Commit)
	}
	if _, err := time.Parse(time.RFC3339, st.CommitTime); err != nil {
		t.Errorf("commit time %q: %v", st.CommitTime, err)
	}
	given := stamps{Version: "v1.2.3", Commit: "abc", CommitTime: "2025-01-01T00:00:00Z"}
	if got, err := stampsFor(t.Context(), root, given); err != nil || got != given {
		t.Errorf("stampsFor(%+v) = %+v, %v; want them as given", given, got, err)
	}
	if _, err := stampsFor(t.Context(), root, stamps{Version: "v1 -X main.x=y"}); err == nil {
		t.Error("a version with a space was accepted: it would add linker flags")
	}
}

// TestRelease builds the agent for armv7 twice, into two dist
// directories: the binary is what its platform runs, stamped, and the two
// builds are byte for byte the same, as SHA256SUMS says. One platform is
// enough here (deploy/crossarch builds and runs arm64 and armv7 with the
// same compiled packages, which the build cache shares).
func TestRelease(t *testing.T) {
	if testing.Short() {
		t.Skip("cross-compiles the agent twice")
	}
	ctx := t.Context()
	args := []string{"-platforms", "linux/arm/v7", "-cmds", "fleetlearn-edge",
		"-version", "v1.2.3-test", "-commit", "0123456789abcdef0123456789abcdef01234567", "-commit-time", "2025-01-02T03:04:05Z"}
	var sums [2][]byte
	var dists [2]string
	for i := range 2 {
		dists[i] = t.TempDir()
		// A stale file of an earlier release must not survive.
		stale := filepath.Join(dists[i], "linux-armv7", "fleetlearn-old")
		if err := os.MkdirAll(filepath.Dir(stale), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(stale, []byte("old"), 0o644); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		if err := run(ctx, append([]string{"-dist", dists[i]}, args...), &out); err != nil {
			t.Fatalf("release: %v\n%s", err, out.String())
		}
		t.Logf("release %d:\n%s", i+1, out.String())
		if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s survived the release (%v)", stale, err)
		}
		b, err := os.ReadFile(filepath.Join(dists[i], "SHA256SUMS"))
		if err != nil {
			t.Fatal(err)
		}
		sums[i] = b
	}
	if !bytes.Equal(sums[0], sums[1]) {
		t.Errorf("two builds differ:\n%s\n%s", sums[0], sums[1])
	}
	// sha256sum -c's format, one line per binary, and the sums are right.
	lines := strings.Split(strings.TrimSuffix(string(sums[0]), "\n"), "\n")
	var names []string
	for _, l := range lines {
		sum, name, ok := strings.Cut(l, "  ")
		if !ok {
			t.Fatalf("SHA256SUMS line %q", l)
		}
		b, err := os.ReadFile(filepath.Join(dists[0], filepath.FromSlash(name)))
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.Sum256(b)
		if hex.EncodeToString(h[:]) != sum {
			t.Errorf("%s: SHA256SUMS says %s, the file hashes to %x", name, sum, h)
		}
		names = append(names, name)
	}
	if want := []string{"linux-armv7/fleetlearn-edge"}; !slices.Equal(names, want) {
		t.Errorf("SHA256SUMS lists %v, want %v", names, want)
	}

	// check tells a binary for another board, or with other stamps, from
	// the one asked for.
	root, err := moduleRoot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st := stamps{Version: "v1.2.3-test", Commit: "0123456789abcdef0123456789abcdef01234567", CommitTime: "2025-01-02T03:04:05Z"}
	armv7 := filepath.Join(dists[0], "linux-armv7", "fleetlearn-edge")
	if err := check(armv7, platform{"linux", "arm", "v7"}, st, root); err != nil {
		t.Errorf("check of the armv7 build: %v", err)
	}
	if err := check(armv7, platform{"linux", "arm64", ""}, st, root); err == nil || !strings.Contains(err.Error(), "ELF machine") {
		t.Errorf("check of the armv7 build as arm64: %v, want an ELF machine mismatch", err)
	}
	if err := check(armv7, platform{"linux", "arm", "v6"}, st, root); err == nil || !strings.Contains(err.Error(), "GOARM") {
		t.Errorf("check of the armv7 build as armv6: %v, want a GOARM mismatch", err)
	}
	other := st
	other.Commit = "fedcba9876543210fedcba9876543210fedcba98"
	if err := check(armv7, platform{"linux", "arm", "v7"}, other, root); err == nil || !strings.Contains(err.Error(), "stamp") {
		t.Errorf("check with another commit: %v, want the stamp missing", err)
	}
}

// TestUsage: command-line mistakes are refused before anything is built,
// with what to do.
func TestUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-platforms", "linux/mips"}, "amd64, arm64 and arm"},
		{[]string{"-cmds", "fleetlearn-nope"}, "fleetlearn-edge"},
		{[]string{"-print", "tag"}, "version, commit or commit-time"},
		{[]string{"extra"}, "flags only"},
		{[]string{"-nope"}, "go run ./deploy/release -h"},
	} {
		dist := t.TempDir()
		args := append([]string{"-dist", dist, "-version", "v1.0.0", "-commit", "abc", "-commit-time", "2025-01-01T00:00:00Z"}, c.args...)
		err := run(context.Background(), args, &bytes.Buffer{})
		var u usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("release %q: %v, want a usage error mentioning %q", c.args, err, c.want)
		}
		if entries, _ := os.ReadDir(dist); len(entries) != 0 {
			t.Errorf("release %q wrote %v", c.args, entries)
		}
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"-version", "v1.0.0", "-commit", "abc", "-commit-time", "2025-01-01T00:00:00Z",
		"-print", "version"}, &out); err != nil || out.String() != "v1.0.0\n" {
		t.Errorf("-print version: %q, %v", out.String(), err)
	}
}
