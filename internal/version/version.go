// Package version says which build of Fleetlearn a binary is, for the
// binaries' version commands and the server's logs: the release version
// (set at link time, else the module version, else "devel"), the VCS
// commit and time Go stamped into the build, and the Go version.
package version

import (
	"runtime"
	"runtime/debug"
	"strings"
)

// Version is the release version; release builds set it with
// -ldflags "-X github.com/fleetlearn/fleetlearn/internal/version.Version=v1.2.3".
var Version = ""

// Info is one build's identity.
type Info struct {
	Version  string // release or module version, or "devel"
	Commit   string // VCS revision, "" when unknown; "+dirty" when modified
	Time     string // commit time, RFC 3339, "" when unknown
	Go       string // Go version that built the binary
	Platform string // GOOS/GOARCH
}

// Get reads the build information of the running binary.
func Get() Info {
	i := Info{Version: Version, Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	bi, ok := debug.ReadBuildInfo()
	if ok {
		if i.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			i.Version = bi.Main.Version
		}
		dirty := false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				i.Commit = s.Value
			case "vcs.time":
				i.Time = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if dirty && i.Commit != "" {
			i.Commit += "+dirty"
		}
	}
	if i.Version == "" {
		i.Version = "devel"
	}
	return i
}

// String is the one-line form the binaries print: the program name, the
// version, the commit and the Go version, then any extra facts (such as
// "module ABI 1") the caller adds.
func (i Info) String(program string, extra ...string) string {
	parts := []string{program + " " + i.Version}
	if i.Commit != "" {
		c, dirty := strings.CutSuffix(i.Commit, "+dirty")
		if len(c) > 12 {
			c = c[:12]
		}
		if dirty {
			c += "+dirty"
		}
		parts = append(parts, "commit "+c)
	}
	parts = append(parts, i.Go, i.Platform)
	return strings.Join(append(parts, extra...), ", ")
}
