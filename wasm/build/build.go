// Package build compiles Go update modules from source with the local Go
// toolchain (GOOS=wasip1 GOARCH=wasm -buildmode=c-shared), for tests and
// module authors; Fleetlearn's own example modules ship prebuilt in
// wasm/examples/embedded. It needs the go command; deployed agents never
// build anything.
package build

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
)

// Example module packages shipped with Fleetlearn.
const (
	MLP     = "github.com/fleetlearn/fleetlearn/wasm/examples/mlp"
	Softmax = "github.com/fleetlearn/fleetlearn/wasm/examples/softmax"
	LM      = "github.com/fleetlearn/fleetlearn/wasm/examples/lm"
	Seq     = "github.com/fleetlearn/fleetlearn/wasm/examples/seq"
)

// Module builds the Go package pkg (an import path, or a directory relative
// to dir) into a WASM update module and returns its bytes. dir is the working
// directory of the build ("" for the current one).
func Module(ctx context.Context, dir, pkg string) ([]byte, error) {
	tmp, err := os.MkdirTemp("", "fleetlearn-build-")
	if err != nil {
		return nil, fmt.Errorf("build %s: %w", pkg, err)
	}
	defer os.RemoveAll(tmp)
	out := filepath.Join(tmp, "module.wasm")
	cmd := exec.CommandContext(ctx, goTool(), "build", "-trimpath", "-buildmode=c-shared", "-o", out, pkg)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build %s: %w\n%s", pkg, err, msg)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		return nil, fmt.Errorf("build %s: %w", pkg, err)
	}
	return b, nil
}

func goTool() string {
	if p := filepath.Join(runtime.GOROOT(), "bin", "go"); fileExists(p) {
		return p
	}
	return "go"
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
