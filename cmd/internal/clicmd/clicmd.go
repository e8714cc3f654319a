// Package clicmd is the fleetlearn command line's entry point, run by
// cmd/fleetlearn's main and, in tests, by a test binary standing in for
// the program (cmd/cmdtest).
package clicmd

import (
	"context"
	"fmt"
	"io"

	"github.com/fleetlearn/fleetlearn/cli"
	"github.com/fleetlearn/fleetlearn/demo"
)

// Main runs fleetlearn's command line args until ctx ends and returns the
// exit status, having printed any error to stderr.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == demo.RankCommandName {
		// The demo's embedded pool workers run their ranks as children of
		// this binary; the outcome is the exit status the worker reads.
		return demo.RankMain(ctx, args[1:])
	}
	root := cli.NewRootCommand()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	if ctx.Err() != nil {
		fmt.Fprintln(stderr, "fleetlearn: interrupted")
		return 130
	}
	fmt.Fprintln(stderr, "fleetlearn:", err)
	return 1
}
