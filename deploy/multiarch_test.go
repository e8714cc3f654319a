package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// imagePlatforms are the platforms the images are built for: those of the
// release binaries (deploy/release).
var imagePlatforms = []string{"linux/amd64", "linux/arm64", "linux/arm/v7"}

const versionStampPkg = "github.com/fleetlearn/fleetlearn/internal/version"

// dockerStage is one stage of a Dockerfile, as BuildKit reads it.
type dockerStage struct {
	platform, image, name string
	args                  map[string]string // ARG name → default ("" for none)
	env                   []string          // ENV, as NAME=value
	runs                  []string          // RUN commands, --mount options left out
}

// parseStages reads the global ARGs and the stages of a Dockerfile.
func parseStages(t *testing.T, name string) (global map[string]string, stages []*dockerStage, comments string) {
	t.Helper()
	lines, comments := dockerfileLines(t, name)
	global = map[string]string{}
	args := func(m map[string]string, rest string) {
		for _, a := range strings.Fields(rest) {
			k, v, _ := strings.Cut(a, "=")
			m[k] = strings.Trim(v, `"`)
		}
	}
	var st *dockerStage
	for _, l := range lines {
		instr, rest, _ := strings.Cut(l, " ")
		rest = strings.TrimSpace(rest)
		switch strings.ToUpper(instr) {
		case "FROM":
			st = &dockerStage{args: map[string]string{}}
			f := strings.Fields(rest)
			for len(f) > 0 && strings.HasPrefix(f[0], "--") {
				if p, ok := strings.CutPrefix(f[0], "--platform="); ok {
					st.platform = p
				}
				f = f[1:]
			}
			if len(f) == 0 {
				t.Fatalf("%s: FROM %s names no image", name, rest)
			}
			st.image = f[0]
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				st.name = f[2]
			}
			stages = append(stages, st)
		case "ARG":
			if st == nil {
				args(global, rest)
			} else {
				args(st.args, rest)
			}
		case "ENV":
			if st != nil {
				st.env = append(st.env, strings.Fields(rest)...)
			}
		case "RUN":
			// The command is what follows the options, spacing kept.
			i := 0
			for i < len(rest) && strings.HasPrefix(rest[i:], "--") {
				j := strings.IndexByte(rest[i:], ' ')
				if j < 0 {
					i = len(rest)
					break
				}
				i += j + 1
				for i < len(rest) && rest[i] == ' ' {
					i++
				}
			}
			if st != nil {
				st.runs = append(st.runs, rest[i:])
			}
		}
	}
	return global, stages, comments
}

// goCall is what a stub go command was run with.
type goCall struct {
	env  map[string]string
	args []string
}

// runBuildStage runs the build stage's RUN commands as BuildKit would
// for platform (sh -c, with the stage's ENV and ARGs in the environment),
// with go and mkdir replaced by stubs that record their calls: the shell
// logic that turns TARGETARCH and TARGETVARIANT into GOARCH and GOARM is
// executed, not read.
func runBuildStage(t *testing.T, st *dockerStage, platform string, buildArgs map[string]string) []goCall {
	t.Helper()
	stub := t.TempDir()
	log := filepath.Join(t.TempDir(), "calls")
	goStub := "#!/bin/sh\n{ for v in GOOS GOARCH GOARM GOAMD64 GOARM64 CGO_ENABLED; do eval \"echo ENV $v=\\${$v}\"; done\n" +
		"for a in \"$@\"; do printf 'ARG %s\\n' \"$a\"; done; echo END; } >> \"$CALLS\"\n"
	if err := os.WriteFile(filepath.Join(stub, "go"), []byte(goStub), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stub, "mkdir"), []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	p := strings.Split(platform, "/")
	env := []string{"PATH=" + stub, "CALLS=" + log, "BUILDPLATFORM=linux/amd64", "TARGETPLATFORM=" + platform,
		"TARGETOS=" + p[0], "TARGETARCH=" + p[1], "TARGETVARIANT="}
	if len(p) == 3 {
		env[len(env)-1] = "TARGETVARIANT=" + p[2]
	}
	for k, v := range st.args {
		if strings.HasPrefix(k, "TARGET") || strings.HasPrefix(k, "BUILD") {
			continue // BuildKit sets them
		}
		if b, ok := buildArgs[k]; ok {
			v = b
		}
		env = append(env, k+"="+v)
	}
	env = append(env, st.env...)
	for _, r := range st.runs {
		cmd := exec.Command("/bin/sh", "-c", r)
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("RUN %s for %s: %v\n%s", r, platform, err, out)
		}
	}
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatalf("the build stage never ran go: %v", err)
	}
	var calls []goCall
	c := goCall{env: map[string]string{}}
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "END":
			calls = append(calls, c)
			c = goCall{env: map[string]string{}}
		case strings.HasPrefix(line, "ENV "):
			k, v, _ := strings.Cut(strings.TrimPrefix(line, "ENV "), "=")
			c.env[k] = v
		case strings.HasPrefix(line, "ARG "):
			c.args = append(c.args, strings.TrimPrefix(line, "ARG "))
		}
	}
	return calls
}

// TestDockerMultiPlatform checks that each image builds for every
// platform of the fleet: the build stage runs on the builder's platform
// and cross-compiles for the target's GOOS, GOARCH and GOARM, stamping
// the version and commit given as build arguments; the final stage is
// the target's base image; the documented buildx command names the
// platforms and passes the stamps.
func TestDockerMultiPlatform(t *testing.T) {
	for _, ic := range imageChecks {
		t.Run(filepath.Base(ic.dockerfile), func(t *testing.T) {
			global, stages, comments := parseStages(t, ic.dockerfile)
			if len(stages) != 2 {
				t.Fatalf("%s: %d stages, want build and final", ic.dockerfile, len(stages))
			}
			bs, final := stages[0], stages[1]
			if bs.platform != "$BUILDPLATFORM" && bs.platform != "${BUILDPLATFORM}" {
				t.Errorf("%s: build stage FROM --platform=%q, want $BUILDPLATFORM: it would run the Go toolchain under emulation",
					ic.dockerfile, bs.platform)
			}
			if final.platform != "" {
				t.Errorf("%s: final stage FROM --platform=%s: it must be the target platform's image", ic.dockerfile, final.platform)
			}
			if _, ok := global["GO_VERSION"]; !ok {
				t.Errorf("%s: no global ARG GO_VERSION", ic.dockerfile)
			}
			for _, a := range []string{"TARGETOS", "TARGETARCH", "TARGETVARIANT", "VERSION", "COMMIT"} {
				if _, ok := bs.args[a]; !ok {
					t.Errorf("%s: the build stage does not declare ARG %s; a stage sees only the ARGs it declares", ic.dockerfile, a)
				}
			}

			const version, commit = "v1.2.3", "0123456789abcdef0123456789abcdef01234567"
			wantGOARM := map[string]string{"linux/arm/v7": "7", "linux/arm/v6": "6"}
			for _, p := range append(slices.Clone(imagePlatforms), "linux/arm/v6", "linux/amd64/v3") {
				calls := runBuildStage(t, bs, p, map[string]string{"VERSION": version, "COMMIT": commit})
				var builds []goCall
				for _, c := range calls {
					if len(c.args) > 0 && c.args[0] == "build" {
						builds = append(builds, c)
					}
				}
				if len(builds) != 1 {
					t.Fatalf("%s for %s: %d go build commands, want 1 (calls %+v)", ic.dockerfile, p, len(builds), calls)
				}
				b := builds[0]
				parts := strings.Split(p, "/")
				want := map[string]string{"GOOS": parts[0], "GOARCH": parts[1], "GOARM": wantGOARM[p], "CGO_ENABLED": "0"}
				if parts[1] == "amd64" {
					want["GOAMD64"] = "v1"
					if len(parts) == 3 {
						want["GOAMD64"] = parts[2]
					}
				}
				for k, v := range want {
					if b.env[k] != v {
						t.Errorf("%s for %s: go build with %s=%q, want %q", ic.dockerfile, p, k, b.env[k], v)
					}
				}
				var ldflags string
				for _, a := range b.args {
					if l, ok := strings.CutPrefix(a, "-ldflags="); ok {
						ldflags = l
					}
				}
				for _, w := range []string{"-X " + versionStampPkg + ".Version=" + version, "-X " + versionStampPkg + ".Commit=" + commit} {
					if !strings.Contains(ldflags, w) {
						t.Errorf("%s for %s: -ldflags %q do not stamp %q", ic.dockerfile, p, ldflags, w)
					}
				}
				for _, w := range append([]string{"-trimpath", "-buildvcs=false"}, func() []string {
					var pk []string
					for _, bin := range ic.binaries {
						pk = append(pk, "./cmd/"+bin)
					}
					return pk
				}()...) {
					if !slices.Contains(b.args, w) {
						t.Errorf("%s for %s: go build %q lacks %s", ic.dockerfile, p, b.args, w)
					}
				}
			}

			// The documented multi-platform build.
			m := regexp.MustCompile(`docker buildx build --platform (\S+)([^\n]*)`).FindStringSubmatch(comments)
			if m == nil {
				t.Fatalf("%s: no comment shows docker buildx build --platform …", ic.dockerfile)
			}
			if got := strings.Split(m[1], ","); !slices.Equal(got, imagePlatforms) {
				t.Errorf("%s: documented platforms %v, want %v", ic.dockerfile, got, imagePlatforms)
			}
			for _, w := range []string{`--build-arg VERSION="$(go run ./deploy/release -print version)"`,
				`--build-arg COMMIT="$(go run ./deploy/release -print commit)"`, "-f deploy/" + ic.dockerfile, "--push ."} {
				if !strings.Contains(m[2], w) {
					t.Errorf("%s: the documented buildx command lacks %s:\n%s", ic.dockerfile, w, m[0])
				}
			}
		})
	}

	// The README shows the same command, and the release tool's output
	// stays out of the build context.
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "docker buildx build --platform "+strings.Join(imagePlatforms, ",")) {
		t.Errorf("deploy/README.md does not show docker buildx build --platform %s", strings.Join(imagePlatforms, ","))
	}
	b, err := os.ReadFile("../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	ign, err := parseDockerignore(string(b))
	if err != nil {
		t.Fatal(err)
	}
	if !ign.excludes("dist/linux-arm64/fleetlearn-edge") || !ign.excludes("dist/SHA256SUMS") {
		t.Error(".dockerignore sends dist/, the release tool's output, to the builder")
	}
}
