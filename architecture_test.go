package fleetlearn_test

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

const mod = "github.com/fleetlearn/fleetlearn"

// pure are the libraries that must stay free of networking and of the services,
// so that they can be embedded anywhere and reasoned about alone.
var pure = []string{"aggregator", "privacy", "audit", "wasm", "model", "data"}

// netImports may not be imported directly by a pure library.
var netImports = []string{"net", "net/http", "net/rpc", "net/smtp", "crypto/tls",
	"google.golang.org/grpc", "github.com/nats-io/"}

// netDeps may not appear anywhere in a pure library's dependency graph. The
// standard net packages can, through third-party code that is never asked to
// use them (wazero links net for WASI sockets the sandbox never grants; jwx
// links net/http for JWKS fetching): the direct-import rule above keeps our
// own code off the network.
var netDeps = []string{"google.golang.org/grpc", "github.com/nats-io/"}

type pkg struct {
	path          string
	imports, deps []string
}

func listPackages(t *testing.T) []pkg {
	t.Helper()
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	out, err := exec.Command(gobin, "list", "-f",
		`{{.ImportPath}}|{{join .Imports ","}}|{{join .Deps ","}}`, "./...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	var ps []pkg
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "|")
		if len(f) != 3 {
			t.Fatalf("go list: unexpected line %q", line)
		}
		ps = append(ps, pkg{f[0], strings.Split(f[1], ","), strings.Split(f[2], ",")})
	}
	return ps
}

func under(path, dir string) bool {
	p := mod + "/" + dir
	return path == p || strings.HasPrefix(path, p+"/")
}

func matches(dep, rule string) bool {
	if strings.HasSuffix(rule, "/") {
		return strings.HasPrefix(dep, rule)
	}
	return dep == rule || strings.HasPrefix(dep, rule+"/")
}

// TestImportRules enforces the architecture: dependencies point one way.
func TestImportRules(t *testing.T) {
	ps := listPackages(t)
	if len(ps) < 5 {
		t.Fatalf("go list found only %d packages", len(ps))
	}
	// The wire messages' package also holds the generated gRPC stubs, so a
	// pure library using the messages (SecAgg's state machines) links grpc
	// without calling it. Allow exactly those packages, nothing more.
	viaProto := map[string]bool{}
	for _, p := range ps {
		if p.path == mod+"/proto/fleetlearn/v1" {
			for _, d := range p.deps {
				viaProto[d] = true
			}
		}
	}
	if len(viaProto) == 0 {
		t.Fatal("go list did not list the proto package")
	}
	checked := 0
	for _, p := range ps {
		isPure := false
		for _, d := range pure {
			isPure = isPure || under(p.path, d)
		}
		if isPure {
			checked++
			for _, imp := range p.imports {
				for _, rule := range netImports {
					if matches(imp, rule) {
						t.Errorf("%s imports %s: pure libraries do no networking", p.path, imp)
					}
				}
			}
			for _, dep := range p.deps {
				for _, rule := range netDeps {
					if matches(dep, rule) && !viaProto[dep] {
						t.Errorf("%s depends on %s: pure libraries do no networking", p.path, dep)
					}
				}
				for _, svc := range []string{"server", "edge", "cmd"} {
					if under(dep, svc) {
						t.Errorf("%s depends on %s: pure libraries import no services", p.path, dep)
					}
				}
			}
		}
		if under(p.path, "edge") || under(p.path, "server") {
			other := map[bool]string{true: "server", false: "edge"}[under(p.path, "edge")]
			for _, dep := range p.deps {
				if under(dep, other) {
					t.Errorf("%s depends on %s: server and edge share no code by import", p.path, dep)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no pure library packages found")
	}
}
