package cli_test

import (
	"context"
	"os"
	"os/signal"
	"syscall"
	"testing"

	"github.com/fleetlearn/fleetlearn/demo"
)

// TestMain lets this test binary be the demo's rank command: the demo's
// embedded pool workers run their ranks as children of the executable,
// which in a test is this binary.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == demo.RankCommandName {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		code := demo.RankMain(ctx, os.Args[2:])
		stop()
		os.Exit(code)
	}
	os.Exit(m.Run())
}
