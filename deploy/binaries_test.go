package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

var (
	binOnce sync.Once
	binDir  string
	binErr  string
)

// TestMain removes the binaries bins built, which outlive any one test.
func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// bins builds fleetlearn, fleetlearn-server, fleetlearn-edge and
// fleetlearn-worker once per test binary and returns the directory that
// holds them. It skips the test under -short: building takes tens of
// seconds.
func bins(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the release binaries")
	}
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "fleetlearn-deploy-bin-")
		if err != nil {
			binErr = err.Error()
			return
		}
		binDir = dir
		cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", dir+string(os.PathSeparator),
			"./cmd/fleetlearn", "./cmd/fleetlearn-server", "./cmd/fleetlearn-edge", "./cmd/fleetlearn-worker")
		cmd.Dir = ".."
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = "go build: " + err.Error() + "\n" + string(out)
		}
	})
	if binErr != "" {
		t.Fatal(binErr)
	}
	return binDir
}
