package version

import (
	"runtime"
	"strings"
	"testing"
)

func TestString(t *testing.T) {
	i := Info{Version: "v1.2.3", Commit: "0123456789abcdef0123+dirty", Go: "go1.26", Platform: "linux/amd64"}
	if got, want := i.String("fleetlearn", "module ABI 1"), "fleetlearn v1.2.3, commit 0123456789ab+dirty, go1.26, linux/amd64, module ABI 1"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
	i.Commit = ""
	if got := i.String("x"); strings.Contains(got, "commit") {
		t.Errorf("String without a commit = %q", got)
	}
}

func TestGet(t *testing.T) {
	i := Get()
	if i.Version == "" || i.Go != runtime.Version() || i.Platform != runtime.GOOS+"/"+runtime.GOARCH {
		t.Fatalf("Get = %+v", i)
	}
	old := Version
	Version = "v9.9.9"
	defer func() { Version = old }()
	if Get().Version != "v9.9.9" {
		t.Error("the link-time version does not win")
	}
}
