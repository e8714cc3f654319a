// Command fleetlearn-worker is the Fleetlearn pool agent: it lends this
// machine's CPUs, memory and GPUs to a pool server and runs the pretraining
// job ranks it is leased, each as a child process that is metered and dies
// with the agent.
//
//	fleetlearn-worker run --server HOST:7070 --ca ca.crt --token-file token --work-dir DIR
//
// Run "fleetlearn-worker run --help" for every flag. SIGINT or SIGTERM stops
// the agent and its ranks. The hidden "rank" command is how the agent runs a
// built-in trainer rank; it is not for people.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

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

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
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
