package wasm

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero/api"
)

// TestSDKBindsTheHostTable: each SDK declares, with //go:wasmimport, exactly
// the host functions of its ABI version, under that version's namespace and
// with the host's signatures, so the two copies of the bindings cannot drift
// from the one host table.
func TestSDKBindsTheHostTable(t *testing.T) {
	for _, tc := range []struct {
		dir     string
		version int
	}{{"sdk", 1}, {"sdk/v2", 2}} {
		t.Run(tc.dir, func(t *testing.T) {
			got := wasmImports(t, tc.dir)
			want := map[string]string{}
			for _, f := range hostFunctions {
				if f.since <= tc.version {
					want[HostModuleOf(tc.version)+"."+f.name] = signature(f.params, f.results)
				}
			}
			for name, sig := range want {
				if got[name] != sig {
					t.Errorf("%s: %s declared as %q, host serves %q", tc.dir, name, got[name], sig)
				}
			}
			for name := range got {
				if _, ok := want[name]; !ok {
					t.Errorf("%s: declares %s, which ABI v%d does not serve", tc.dir, name, tc.version)
				}
			}
		})
	}
}

func signature(params, results []api.ValueType) string {
	names := func(ts []api.ValueType) string { return strings.Join(typeNames(ts), ",") }
	return "(" + names(params) + ")->(" + names(results) + ")"
}

// wasmImports reads the //go:wasmimport declarations of the Go files in dir.
func wasmImports(t *testing.T, dir string) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("%s: %v, %d files", dir, err, len(files))
	}
	wasmType := map[string]api.ValueType{"uint32": i32, "int32": i32, "float32": f32, "float64": f64}
	types := func(fl *ast.FieldList) []api.ValueType {
		var out []api.ValueType
		if fl == nil {
			return out
		}
		for _, f := range fl.List {
			id, ok := f.Type.(*ast.Ident)
			if !ok {
				t.Fatalf("%s: parameter of type %T", dir, f.Type)
			}
			vt, ok := wasmType[id.Name]
			if !ok {
				t.Fatalf("%s: parameter of Go type %s", dir, id.Name)
			}
			for range max(1, len(f.Names)) {
				out = append(out, vt)
			}
		}
		return out
	}
	got := map[string]string{}
	fset := token.NewFileSet()
	for _, file := range files {
		f, err := parser.ParseFile(fset, file, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Doc == nil {
				continue
			}
			for _, c := range fn.Doc.List {
				w := strings.Fields(strings.TrimPrefix(c.Text, "//go:wasmimport "))
				if !strings.HasPrefix(c.Text, "//go:wasmimport ") || len(w) != 2 {
					continue
				}
				got[w[0]+"."+w[1]] = signature(types(fn.Type.Params), types(fn.Type.Results))
			}
		}
	}
	return got
}

func TestVersions(t *testing.T) {
	if got := SupportedABIVersions(); !slices.Equal(got, []uint32{1, 2, 3, 4}) || ABIVersion != 4 || MinABIVersion != 1 {
		t.Errorf("SupportedABIVersions() = %v, ABIVersion %d, MinABIVersion %d", got, ABIVersion, MinABIVersion)
	}
	if HostModuleOf(1) != "fleetlearn_v1" || HostModuleOf(ABIVersion) != HostModule {
		t.Errorf("HostModuleOf(1) = %q, HostModuleOf(%d) = %q, HostModule %q", HostModuleOf(1), ABIVersion, HostModuleOf(ABIVersion), HostModule)
	}
	for mod, v := range map[string]int{"fleetlearn_v1": 1, "fleetlearn_v2": 2, "fleetlearn_v3": 3, "fleetlearn_v4": 4, "fleetlearn_v5": 0, "fleetlearn_v0": 0, "env": 0} {
		if got := namespaceVersion(mod); got != v {
			t.Errorf("namespaceVersion(%q) = %d, want %d", mod, got, v)
		}
	}
	for _, f := range hostFunctions {
		if f.since < MinABIVersion || f.since > ABIVersion {
			t.Errorf("host function %s: since v%d", f.name, f.since)
		}
	}
	if len(hostByName) != len(hostFunctions) {
		t.Errorf("%d host functions, %d names: a name is served twice", len(hostFunctions), len(hostByName))
	}
}
