// Package workercmd is fleetlearn-worker's command line, run by cmd/fleetlearn-worker's
// main and, in tests, by a test binary standing in for the program
// (cmd/cmdtest).
package workercmd

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/fleetlearn/fleetlearn/internal/cliflags"
	"github.com/fleetlearn/fleetlearn/worker"
)

// Exit statuses.
const (
	exitError = 1
	exitUsage = 2
	// exitOperator says running again will not help until the operator
	// acts: the server refused the token.
	exitOperator = 3
)

// Main runs fleetlearn-worker's command line args until ctx ends and
// returns the exit status, having printed any error to stderr.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return run(ctx, args, stdout, stderr)
}

// run executes the command line and returns the exit status, having
// printed any error.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var rankErr error
	ranRank := false
	root := newRootCommand(func(err error) { rankErr, ranRank = err, true })
	root.SetArgs(cliflags.SingleDash(root, args))
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if ranRank {
		// A rank's outcome is its exit status, which its agent reads.
		return worker.RankExitCode(rankErr)
	}
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "fleetlearn-worker:", err)
	switch {
	case cliflags.IsUsage(err):
		return exitUsage
	case errors.Is(err, worker.ErrRefused):
		return exitOperator
	}
	return exitError
}
