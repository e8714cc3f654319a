package fleetlearn_test

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

const mod = "github.com/fleetlearn/fleetlearn"

// pure are the libraries that must stay free of networking and of the services,
// so that they can be embedded anywhere and reasoned about alone.
var pure = []string{"aggregator", "privacy", "audit", "wasm", "model", "data", "pool", "round"}

// services are the three programs' cores: none imports another's code.
var services = []string{"server", "edge", "worker"}

// netImports may not be imported directly by a pure library.
var netImports = []string{"net", "net/http", "net/rpc", "net/smtp", "crypto/tls",
	"google.golang.org/grpc", "github.com/nats-io/"}

// netDeps may not appear anywhere in a pure library's dependency graph. The
// standard net packages can, through third-party code that is never asked to
// use them (wazero links net for WASI sockets the sandbox never grants; jwx
// links net/http for JWKS fetching): the direct-import rule above keeps our
// own code off the network.
var netDeps = []string{"google.golang.org/grpc", "github.com/nats-io/"}

// telemetryDeps may not appear in a pure library's dependency graph either:
// the services trace what the libraries do (internal/tracing), so that a
// library embedded elsewhere carries no telemetry SDK.
var telemetryDeps = []string{"go.opentelemetry.io/"}

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
					if matches(dep, rule) {
						t.Errorf("%s depends on %s: pure libraries do no networking", p.path, dep)
					}
				}
				for _, rule := range telemetryDeps {
					if matches(dep, rule) {
						t.Errorf("%s depends on %s: pure libraries are traced by their callers, not instrumented", p.path, dep)
					}
				}
				for _, svc := range append([]string{"cmd"}, services...) {
					if under(dep, svc) {
						t.Errorf("%s depends on %s: pure libraries import no services", p.path, dep)
					}
				}
			}
		}
		for _, svc := range services {
			if !under(p.path, svc) {
				continue
			}
			for _, other := range services {
				if other == svc {
					continue
				}
				for _, dep := range p.deps {
					if under(dep, other) {
						t.Errorf("%s depends on %s: server, edge and worker share no code by import", p.path, dep)
					}
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no pure library packages found")
	}
}

// TestWitnessIsPure: the audit log's witness (audit/witness) is a library
// that any program can embed to witness the log: it does no networking (its
// caller fetches checkpoints and delivers cosignatures) and depends on no
// service and no app.
func TestWitnessIsPure(t *testing.T) {
	const path = mod + "/audit/witness"
	var found *pkg
	for _, p := range listPackages(t) {
		if p.path == path {
			found = &p
		}
	}
	if found == nil {
		t.Fatalf("%s not found", path)
	}
	for _, imp := range found.imports {
		for _, rule := range netImports {
			if matches(imp, rule) {
				t.Errorf("%s imports %s: the witness does no networking", path, imp)
			}
		}
	}
	for _, dep := range found.deps {
		for _, rule := range netDeps {
			if matches(dep, rule) {
				t.Errorf("%s depends on %s: the witness does no networking", path, dep)
			}
		}
		for _, top := range []string{"server", "edge", "worker", "cli", "demo", "cmd", "client"} {
			if under(dep, top) {
				t.Errorf("%s depends on %s: the witness imports no service, app or client", path, dep)
			}
		}
	}
}

// apps are the programs' front ends: nothing but cmd/ may import them.
var apps = []string{"cli", "demo"}

// protocolHelpers, in internal/, translate the protocol for both sides:
// they may use proto, identity and wasm, and never a service or an app.
var protocolHelpers = []string{"devproto", "simfleet", "sandboxlimits"}

// protocolHelperImports are the packages of ours a protocol helper may
// import, beyond the leaves and the other protocol helpers (the simulated
// fleet runs the device protocol of devproto, whose decisions are the round
// engine's).
var protocolHelperImports = []string{"proto", "identity", "wasm", "round"}

// leafImports are the packages of ours that a leaf helper may import beyond
// the other leaves, by leaf. None needs any today; one that must use the
// wire names (proto/wire) or the messages (proto/fleetlearn/v1) is listed
// here, so that the dependency is a decision.
var leafImports = map[string][]string{}

// internalName returns X for a package in internal/X (or below it), and ""
// for any other package.
func internalName(path string) string {
	rest, ok := strings.CutPrefix(path, mod+"/internal/")
	if !ok {
		return ""
	}
	name, _, _ := strings.Cut(rest, "/")
	return name
}

func underAny(path string, dirs []string) bool {
	for _, d := range dirs {
		if under(path, d) {
			return true
		}
	}
	return false
}

// TestLayering enforces the layers below the services: every package in
// top-level internal/ that is not a protocol helper is a
// leaf, importing none of our packages but other leaves; libraries never
// reach up into the services or the apps; the services never into the
// apps; identity stays off nats-server. Deps come from go list, which
// leaves out test imports: a test may use anything.
func TestLayering(t *testing.T) {
	ps := listPackages(t)
	isLeaf := func(path string) bool {
		name := internalName(path)
		return name != "" && !slices.Contains(protocolHelpers, name)
	}
	libraries := append([]string{"identity", "proto", "client"}, pure...)
	seen := map[string]int{}
	for _, p := range ps {
		switch name := internalName(p.path); {
		case isLeaf(p.path):
			seen["leaf"]++
			for _, imp := range p.imports {
				if !strings.HasPrefix(imp, mod+"/") || isLeaf(imp) || underAny(imp, leafImports[name]) {
					continue
				}
				t.Errorf("%s imports %s: a leaf helper imports only other leaves (and what leafImports grants it)", p.path, imp)
			}
		case slices.Contains(protocolHelpers, name):
			seen["protocol helper"]++
			for _, imp := range p.imports {
				if !strings.HasPrefix(imp, mod+"/") || isLeaf(imp) || underAny(imp, protocolHelperImports) ||
					slices.Contains(protocolHelpers, internalName(imp)) {
					continue
				}
				t.Errorf("%s imports %s: a protocol helper imports only proto, identity, wasm, leaf helpers and other protocol helpers", p.path, imp)
			}
		}

		var forbidden []string // where p's dependencies may not go
		switch {
		case internalName(p.path) != "", underAny(p.path, libraries):
			seen["library"]++
			forbidden = append(append([]string{"cmd"}, services...), apps...)
		case underAny(p.path, services):
			seen["service"]++
			forbidden = apps
		}
		// One error per forbidden tree: the first dependency in it names
		// the path well enough.
		for _, f := range forbidden {
			if i := slices.IndexFunc(p.deps, func(dep string) bool { return under(dep, f) }); i >= 0 {
				t.Errorf("%s depends on %s: dependencies point down, from apps to services to libraries", p.path, p.deps[i])
			}
		}

		// deploy/ holds deployment files and the tests that check them
		// against the real tools; a program that imported it would ship
		// those tools' libraries (kustomize, the Kubernetes types).
		if under(p.path, "deploy") {
			seen["deploy"]++
		} else if i := slices.IndexFunc(p.deps, func(dep string) bool { return under(dep, "deploy") }); i >= 0 {
			t.Errorf("%s depends on %s: nothing imports deploy/", p.path, p.deps[i])
		}

		if under(p.path, "identity") {
			seen["identity"]++
			if i := slices.IndexFunc(p.deps, func(dep string) bool { return matches(dep, "github.com/nats-io/nats-server") }); i >= 0 {
				t.Errorf("%s depends on %s: only the server runs nats-server (server/internal/natsembed)", p.path, p.deps[i])
			}
		}
	}
	// Each rule must have had something to check: a rename that empties
	// one would otherwise pass silently.
	for _, kind := range []string{"leaf", "protocol helper", "library", "service", "identity", "deploy"} {
		if seen[kind] == 0 {
			t.Errorf("no %s package found", kind)
		}
	}
}

// moduleLibs are compiled into WASM update modules as well as run natively:
// they may import only the standard library and each other, so modules stay
// small and the model code a module runs is the code the native trainer runs.
var moduleLibs = []string{"model/sgd", "model/lm", "model/seq"}

func TestModuleLibrariesUseOnlyTheStandardLibrary(t *testing.T) {
	for _, p := range listPackages(t) {
		if !slices.ContainsFunc(moduleLibs, func(d string) bool { return p.path == mod+"/"+d }) {
			continue
		}
		for _, dep := range p.deps {
			if dep == "" || !strings.Contains(strings.Split(dep, "/")[0], ".") {
				continue // the standard library
			}
			if !slices.ContainsFunc(moduleLibs, func(d string) bool { return dep == mod+"/"+d }) {
				t.Errorf("%s depends on %s; module libraries may use only the standard library and %v", p.path, dep, moduleLibs)
			}
		}
	}
}

// TestDashboardReadsThroughTheAPI: the web dashboard is a client of the
// server's gRPC API like the CLI, so the API's roles, limits and audit
// apply to it; it reaches none of the server's state directly.
func TestDashboardReadsThroughTheAPI(t *testing.T) {
	found := false
	for _, p := range listPackages(t) {
		if !under(p.path, "server/internal/ui") {
			continue
		}
		found = true
		for _, d := range p.deps {
			if strings.HasPrefix(d, mod+"/server") && !under(d, "server/internal/ui") {
				t.Errorf("%s depends on %s: the dashboard reads and acts only through the API", p.path, d)
			}
		}
	}
	if !found {
		t.Fatal("no server/internal/ui package")
	}
}

// TestRoundEngineIsPure: the round engine (round/) decides from values it
// is given: it imports no messaging, storage, protobuf, network or files,
// so that every rule can be tested as a table and its state carried by any
// service.
func TestRoundEngineIsPure(t *testing.T) {
	banned := []string{"os", "net", "database/sql", "google.golang.org/protobuf", "google.golang.org/grpc",
		"github.com/nats-io/", "modernc.org/sqlite", "github.com/jackc/pgx", mod + "/proto", mod + "/server"}
	found := false
	for _, p := range listPackages(t) {
		if !under(p.path, "round") {
			continue
		}
		found = true
		for _, imp := range p.imports {
			for _, b := range banned {
				if matches(imp, b) {
					t.Errorf("%s imports %s: the round engine is pure", p.path, imp)
				}
			}
		}
	}
	if !found {
		t.Fatal("no round engine package found")
	}
}

// TestDatabaseAccess: SQL is spoken in a few places only, so that every
// statement runs on both backends (SQLite and PostgreSQL) through
// internal/sqldb, and the test-only server of internal/pgtest never ships.
// The store and the audit log use database/sql's types but reach the
// drivers only through internal/sqldb, which opens the connections.
func TestDatabaseAccess(t *testing.T) {
	drivers := []string{"modernc.org/sqlite", "github.com/jackc/pgx"}
	mayUseSQL := []string{"internal/sqldb", "internal/pgtest", "server/internal/store", "audit"}
	mayUseDrivers := []string{"internal/sqldb", "internal/pgtest"}
	for _, p := range listPackages(t) {
		for _, imp := range p.imports {
			if imp == mod+"/internal/pgtest" {
				t.Errorf("%s imports internal/pgtest: it starts throwaway servers for tests only", p.path)
			}
			if underAny(p.path, mayUseDrivers) {
				continue
			}
			for _, d := range drivers {
				if matches(imp, d) {
					t.Errorf("%s imports %s: open databases with internal/sqldb, so that every statement runs on SQLite and PostgreSQL alike", p.path, imp)
				}
			}
			if matches(imp, "database/sql") && !underAny(p.path, mayUseSQL) {
				t.Errorf("%s imports %s: the store (server/internal/store) and the audit log own the databases", p.path, imp)
			}
		}
	}
}

// testHarnesses start real third-party programs for tests (a throwaway
// PostgreSQL, a whole Kubernetes control plane, tools built into a cache):
// only tests and other harnesses may depend on them, so no binary Fleetlearn
// ships carries them or the test-only code they link.
var testHarnesses = []string{"internal/testtool", "internal/pgtest", "server/internal/kube/kubetest", "server/servertest"}

func TestHarnessesStayInTests(t *testing.T) {
	seen := 0
	for _, p := range listPackages(t) {
		if underAny(p.path, testHarnesses) {
			seen++
			continue
		}
		for _, d := range p.deps {
			if underAny(d, testHarnesses) {
				t.Errorf("%s depends on %s: test harnesses are for tests only", p.path, d)
				break
			}
		}
	}
	if seen < len(testHarnesses) {
		t.Errorf("found %d packages under %v, want at least %d: a harness moved; update testHarnesses", seen, testHarnesses, len(testHarnesses))
	}
}
