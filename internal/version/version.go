// Package version says which build of Fleetlearn a binary is, for the
// binaries' version commands and the server's logs: the release version
// (set at link time, else the module version, else "devel"), the VCS
// commit and its time (set at link time, else what Go stamped into the
// build), and the Go version.
//
// Release builds (deploy/release, the Dockerfiles) stamp Version, Commit
// and CommitTime with -ldflags -X: they build with -buildvcs=false, or
// from a tree without .git (a Docker build context), where Go stamps no
// VCS information of its own.
package version

import (
	"runtime"
	"runtime/debug"
	"strings"
)

// The link-time stamps, set with
//
//	-ldflags "-X github.com/fleetlearn/fleetlearn/internal/version.Version=v1.2.3
//	  -X github.com/fleetlearn/fleetlearn/internal/version.Commit=<git rev-parse HEAD>
//	  -X github.com/fleetlearn/fleetlearn/internal/version.CommitTime=<RFC 3339>"
//
// Each that is left empty falls back to the build information Go
// recorded.
var (
	Version    = ""
	Commit     = "" // full hash, with "+dirty" when the tree had changes
	CommitTime = ""
)

// Info is one build's identity.
type Info struct {
	Version  string // release or module version, or "devel"
	Commit   string // VCS revision, "" when unknown; "+dirty" when modified
	Time     string // commit time, RFC 3339, "" when unknown
	Go       string // Go version that built the binary
	Platform string // GOOS/GOARCH, with the variant (GOARM) on 32-bit arm
}

// Get reads the build information of the running binary.
func Get() Info {
	i := Info{Version: Version, Commit: Commit, Time: CommitTime, Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	bi, ok := debug.ReadBuildInfo()
	if ok {
		i = fromBuildInfo(i, bi)
	}
	if i.Version == "" {
		i.Version = "devel"
	}
	return i
}

// fromBuildInfo fills what i leaves empty from Go's build information.
func fromBuildInfo(i Info, bi *debug.BuildInfo) Info {
	if i.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		i.Version = bi.Main.Version
	}
	var rev, at, goarm string
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		case "GOARM":
			goarm = s.Value
		}
	}
	if i.Commit == "" && rev != "" {
		i.Commit = rev
		if dirty {
			i.Commit += "+dirty"
		}
	}
	if i.Time == "" {
		i.Time = at
	}
	// linux/arm alone does not say which ARM: a v6 build runs on a v7
	// board, not the other way round.
	if goarm != "" && strings.HasSuffix(i.Platform, "/arm") {
		i.Platform += "/v" + strings.TrimSuffix(strings.TrimSuffix(goarm, ",softfloat"), ",hardfloat")
	}
	return i
}

// String is the one-line form the binaries print: the program name, the
// version, the commit ("commit unknown" for a build that recorded none:
// `go build` with -buildvcs=false or outside a checkout), the Go version
// and the platform, then any extra facts (such as "module ABI 1") the
// caller adds.
func (i Info) String(program string, extra ...string) string {
	parts := []string{program + " " + i.Version}
	c, dirty := strings.CutSuffix(i.Commit, "+dirty")
	switch {
	case c == "":
		c = "unknown"
	case len(c) > 12:
		c = c[:12]
	}
	if dirty {
		c += "+dirty"
	}
	parts = append(parts, "commit "+c, i.Go, i.Platform)
	return strings.Join(append(parts, extra...), ", ")
}
