package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/fleetlearn/fleetlearn/wasm/examples/embedded"
)

// TestCommittedModulesAreCurrent rebuilds every example module and
// compares it with what the embedded package ships: the recorded digest
// and size, the compressed bytes and the generated Go file. It fails when
// the modules' source (or the SDK or training code they link) changed
// without `go generate ./wasm/examples/embedded`. .ci/run runs the same
// check through go generate and git diff.
func TestCommittedModulesAreCurrent(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every example module")
	}
	ctx := context.Background()
	goVersion, err := goEnv(ctx, "GOVERSION")
	if err != nil {
		t.Fatal(err)
	}
	if goVersion != embedded.GoVersion {
		t.Skipf("the modules were built with %s and this is %s: another toolchain builds other bytes", embedded.GoVersion, goVersion)
	}
	var mods []built
	for _, ex := range examples {
		b, err := buildModule(ctx, ex)
		if err != nil {
			t.Fatal(err)
		}
		mods = append(mods, b)
		m, err := embedded.Lookup(ex.Name)
		if err != nil {
			t.Fatal(err)
		}
		if m.SHA256 != b.SHA256 || m.Size != b.Size {
			t.Errorf("%s: source builds %d bytes with sha256 %s; embedded: %d bytes with sha256 %s; run go generate ./wasm/examples/embedded",
				ex.Name, b.Size, b.SHA256, m.Size, m.SHA256)
		}
		committed, err := os.ReadFile(filepath.Join("..", "..", ex.Name+".wasm.gz"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(committed, b.gz) {
			t.Errorf("%s.wasm.gz differs from a fresh build", ex.Name)
		}
	}
	src, err := render(goVersion, mods)
	if err != nil {
		t.Fatal(err)
	}
	committed, err := os.ReadFile(filepath.Join("..", "..", "modules_gen.go"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(committed, src) {
		t.Errorf("modules_gen.go differs from what gen writes")
	}
	if len(embedded.List()) != len(examples) {
		t.Errorf("embedded has %d modules, gen builds %d", len(embedded.List()), len(examples))
	}
}

// TestBuildIsReproducible builds one module twice, the second time from
// another working directory with a fresh build cache, and wants the same
// bytes: nothing of the machine, the path or the cache gets in.
func TestBuildIsReproducible(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the Go runtime for wasip1 into an empty cache")
	}
	ctx := context.Background()
	ex := examples[0]
	first, err := buildModule(ctx, ex)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("GOCACHE", t.TempDir())
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	// A module path resolves from any directory inside the module.
	t.Chdir(filepath.Join(wd, "..", "..", ".."))
	second, err := buildModule(ctx, ex)
	if err != nil {
		t.Fatal(err)
	}
	if first.SHA256 != second.SHA256 || !bytes.Equal(first.gz, second.gz) {
		t.Errorf("%s: two builds differ: sha256 %s and %s", ex.Name, first.SHA256, second.SHA256)
	}
	if first.Size == 0 || len(first.gz) == 0 {
		t.Errorf("%s: empty build", ex.Name)
	}
}
