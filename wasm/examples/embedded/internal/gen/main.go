// Command gen builds the example update modules of wasm/examples into the
// embedded package: NAME.wasm.gz for each, and modules_gen.go, which embeds
// them and records their SHA-256 and the Go version that built them. It is
// run by `go generate ./wasm/examples/embedded` from the repository.
//
// The build is reproducible: -trimpath keeps the checkout's path out,
// -buildvcs=false the commit, -ldflags=-buildid= the build ID, and the
// environment that could change the code generator (GOFLAGS, GOWASM,
// GOEXPERIMENT, CGO_ENABLED) is fixed. What remains is the source and the
// Go toolchain: another Go release builds other bytes, which is why the Go
// version is recorded.
package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"go/format"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"text/template"

	"github.com/fleetlearn/fleetlearn/wasm/examples/mlpasm"
)

// example is one module to build.
type example struct {
	Name        string
	Package     string
	Description string
	// assemble, when set, writes the module instead of the Go compiler: a
	// module without a language runtime, assembled by its package.
	assemble func() []byte
}

// examples are the modules shipped in the binaries, sorted by name.
var examples = []example{
	{"lm", "github.com/fleetlearn/fleetlearn/wasm/examples/lm",
		"decoder-only transformer language model (package lm), AdamW, ABI v2; trains only the task's trainable tensors (partial and LoRA fine-tuning)", nil},
	{"mlp", "github.com/fleetlearn/fleetlearn/wasm/examples/mlpasm",
		"multi-layer perceptron (fc1, fc2, … with ReLU), mini-batch SGD with optional FedProx, ABI v3; assembled without a language runtime (a few KB, starts in microseconds); the demo's module", mlpasm.Module},
	{"mlp-go", "github.com/fleetlearn/fleetlearn/wasm/examples/mlp",
		"the same multi-layer perceptron written in Go with wasm/sdk, ABI v1 (same weights bit for bit); the example to start from when writing a module in Go", nil},
	{"noop", "github.com/fleetlearn/fleetlearn/wasm/examples/noop",
		"adds a small constant to every parameter, for measuring the system rather than training", nil},
	{"seq", "github.com/fleetlearn/fleetlearn/wasm/examples/seq",
		"any layer list the model records (package seq: conv, pooling, group and layer norm, dropout, dense), mini-batch SGD with optional FedProx, ABI v4; trains only the task's trainable tensors", nil},
	{"softmax", "github.com/fleetlearn/fleetlearn/wasm/examples/softmax",
		"multinomial logistic regression (one Linear layer fc1), reports update_norm", nil},
}

// buildFlags are the go build flags of every module, after "build".
var buildFlags = []string{"-buildmode=c-shared", "-trimpath", "-buildvcs=false", "-ldflags=-buildid="}

// buildEnv fixes what the environment could otherwise change in the output.
var buildEnv = []string{"GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0", "GOFLAGS=", "GOWASM=", "GOEXPERIMENT="}

func main() {
	log.SetFlags(0)
	log.SetPrefix("gen: ")
	dir := flag.String("dir", ".", "directory of the embedded package")
	flag.Parse()
	if err := generate(context.Background(), *dir); err != nil {
		log.Fatal(err)
	}
}

// built is one module's build output.
type built struct {
	example
	SHA256 string
	Size   int
	gz     []byte
}

func generate(ctx context.Context, dir string) error {
	goVersion, err := goEnv(ctx, "GOVERSION")
	if err != nil {
		return err
	}
	var mods []built
	for _, ex := range examples {
		b, err := buildModule(ctx, ex)
		if err != nil {
			return err
		}
		mods = append(mods, b)
	}
	src, err := render(goVersion, mods)
	if err != nil {
		return err
	}
	for _, m := range mods {
		if err := os.WriteFile(filepath.Join(dir, m.Name+".wasm.gz"), m.gz, 0o644); err != nil {
			return err
		}
	}
	return os.WriteFile(filepath.Join(dir, "modules_gen.go"), src, 0o644)
}

// buildModule builds one module and compresses it. The gzip stream is
// deterministic: no name or time in its header, a fixed level.
func buildModule(ctx context.Context, ex example) (built, error) {
	code, err := moduleBytes(ctx, ex)
	if err != nil {
		return built{}, err
	}
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	if err != nil {
		return built{}, err
	}
	if _, err := zw.Write(code); err != nil {
		return built{}, err
	}
	if err := zw.Close(); err != nil {
		return built{}, err
	}
	sum := sha256.Sum256(code)
	return built{example: ex, SHA256: hex.EncodeToString(sum[:]), Size: len(code), gz: gz.Bytes()}, nil
}

// moduleBytes assembles the module or builds it with the Go compiler.
func moduleBytes(ctx context.Context, ex example) ([]byte, error) {
	if ex.assemble != nil {
		return ex.assemble(), nil
	}
	tmp, err := os.MkdirTemp("", "fleetlearn-gen-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	out := filepath.Join(tmp, ex.Name+".wasm")
	args := append(append([]string{"build"}, buildFlags...), "-o", out, ex.Package)
	cmd := exec.CommandContext(ctx, goTool(), args...)
	cmd.Env = append(os.Environ(), buildEnv...)
	if msg, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build %s: %w\n%s", ex.Package, err, msg)
	}
	return os.ReadFile(out)
}

var genTemplate = template.Must(template.New("").Funcs(template.FuncMap{
	"ident": func(name string) string { return strings.ReplaceAll(name, "-", "") },
}).Parse(`// Code generated by go run ./internal/gen; DO NOT EDIT.

package embedded

import _ "embed"

// GoVersion is the Go toolchain that built the modules. The build is
// reproducible with it; another release builds other bytes.
const GoVersion = {{printf "%q" .GoVersion}}
{{range .Modules}}
//go:embed {{.Name}}.wasm.gz
var {{ident .Name}}WASMGzip []byte
{{end}}
var modules = []Module{
{{- range .Modules}}
	{
		Name:        {{printf "%q" .Name}},
		Package:     {{printf "%q" .Package}},
		Description: {{printf "%q" .Description}},
		SHA256:      {{printf "%q" .SHA256}},
		Size:        {{.Size}},
		gz:          {{ident .Name}}WASMGzip,
	},
{{- end}}
}
`))

func render(goVersion string, mods []built) ([]byte, error) {
	var b bytes.Buffer
	if err := genTemplate.Execute(&b, struct {
		GoVersion string
		Modules   []built
	}{goVersion, mods}); err != nil {
		return nil, err
	}
	return format.Source(b.Bytes())
}

func goEnv(ctx context.Context, key string) (string, error) {
	out, err := exec.CommandContext(ctx, goTool(), "env", key).Output()
	if err != nil {
		return "", fmt.Errorf("go env %s: %w", key, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// goTool is the go command that ran `go generate` (it sets $GOROOT), or
// else the one that built this program, so that the modules are built by
// the toolchain the repository selects rather than whichever is on PATH.
func goTool() string {
	for _, root := range []string{os.Getenv("GOROOT"), runtime.GOROOT()} {
		if p := filepath.Join(root, "bin", "go"); root != "" && fileExists(p) {
			return p
		}
	}
	return "go"
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
