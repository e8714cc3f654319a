package version

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestString(t *testing.T) {
	i := Info{Version: "v1.2.3", Commit: "0123456789abcdef0123+dirty", Go: "go1.26", Platform: "linux/amd64"}
	if got, want := i.String("fleetlearn", "module ABI 1"), "fleetlearn v1.2.3, commit 0123456789ab+dirty, go1.26, linux/amd64, module ABI 1"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
	// A build without a commit says so, rather than leave the reader to
	// wonder whether the line was cut.
	i.Commit = ""
	if got, want := i.String("x"), "x v1.2.3, commit unknown, go1.26, linux/amd64"; got != want {
		t.Errorf("String without a commit = %q, want %q", got, want)
	}
}

func TestGet(t *testing.T) {
	i := Get()
	if i.Version == "" || i.Go != runtime.Version() || !strings.HasPrefix(i.Platform, runtime.GOOS+"/"+runtime.GOARCH) {
		t.Fatalf("Get = %+v", i)
	}
	defer func(v, c, ct string) { Version, Commit, CommitTime = v, c, ct }(Version, Commit, CommitTime)
	Version, Commit, CommitTime = "v9.9.9", "fedcba9876543210fedcba9876543210fedcba98", "2025-01-02T03:04:05Z"
	got := Get()
	if got.Version != "v9.9.9" || got.Commit != Commit || got.Time != CommitTime {
		t.Errorf("the link-time stamps do not win: %+v", got)
	}
	if s := got.String("p"); !strings.Contains(s, "v9.9.9, commit fedcba987654,") {
		t.Errorf("String = %q", s)
	}
}

// TestFromBuildInfo: what Go stamps (a `go build` in a checkout, VCS
// stamping on) fills what the link-time stamps leave empty, and no more.
func TestFromBuildInfo(t *testing.T) {
	bi := &debug.BuildInfo{
		Main: debug.Module{Path: "github.com/fleetlearn/fleetlearn", Version: "v0.0.0-20250102030405-0123456789ab+dirty"},
		Settings: []debug.BuildSetting{
			{Key: "GOARM", Value: "7"},
			{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
			{Key: "vcs.time", Value: "2025-01-02T03:04:05Z"},
			{Key: "vcs.modified", Value: "true"},
		},
	}
	got := fromBuildInfo(Info{Platform: "linux/arm"}, bi)
	want := Info{Version: "v0.0.0-20250102030405-0123456789ab+dirty", Commit: "0123456789abcdef0123456789abcdef01234567+dirty",
		Time: "2025-01-02T03:04:05Z", Platform: "linux/arm/v7"}
	if got != want {
		t.Errorf("fromBuildInfo = %+v, want %+v", got, want)
	}

	stamped := Info{Version: "v1.0.0", Commit: "aaaa", Time: "2024-12-31T00:00:00Z", Platform: "linux/arm64"}
	if got := fromBuildInfo(stamped, bi); got != stamped {
		t.Errorf("fromBuildInfo over link-time stamps = %+v, want them kept: %+v", got, stamped)
	}

	// -buildvcs=false and no stamps: nothing to say but the module's
	// placeholder, which Get turns into "devel".
	bare := &debug.BuildInfo{Main: debug.Module{Path: "github.com/fleetlearn/fleetlearn", Version: "(devel)"}}
	if got := fromBuildInfo(Info{Platform: "linux/amd64"}, bare); got.Version != "" || got.Commit != "" || got.Time != "" {
		t.Errorf("fromBuildInfo without VCS information = %+v", got)
	}
}
