package deploy_test

import (
	"testing"

	"github.com/fleetlearn/fleetlearn/cmd/cmdtest"
)

// TestMain lets the test binary run as the programs bins links.
func TestMain(m *testing.M) {
	cmdtest.Main()
	m.Run()
}

// bins returns a directory that holds fleetlearn, fleetlearn-server,
// fleetlearn-edge and fleetlearn-worker: the test binary standing in for
// each (cmd/cmdtest), the same code as cmd/'s mains. It skips the test
// under -short, where the tests that run the programs are left out.
func bins(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("runs the programs")
	}
	return cmdtest.Dir(t)
}
