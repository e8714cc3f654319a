// Command fleetlearn is the Fleetlearn operator CLI: it creates and watches
// federated training tasks and manages models and WASM update modules on an
// aggregator. Run "fleetlearn --help" for the commands.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/fleetlearn/fleetlearn/cli"
	"github.com/fleetlearn/fleetlearn/demo"
	"github.com/fleetlearn/fleetlearn/worker"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	if len(os.Args) > 1 && os.Args[1] == demo.RankCommandName {
		// The demo's embedded pool workers run their ranks as children of
		// this binary; the outcome is the exit status the worker reads.
		code := rank(ctx, os.Args[2:])
		stop()
		os.Exit(code)
	}
	err := cli.NewRootCommand().ExecuteContext(ctx)
	interrupted := ctx.Err() != nil
	stop()
	if err == nil {
		return
	}
	if interrupted {
		fmt.Fprintln(os.Stderr, "fleetlearn: interrupted")
		os.Exit(130)
	}
	fmt.Fprintln(os.Stderr, "fleetlearn:", err)
	os.Exit(1)
}

func rank(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet(demo.RankCommandName, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	lease := fs.String("lease", "", "")
	if err := fs.Parse(args); err != nil || *lease == "" {
		fmt.Fprintf(os.Stderr, "fleetlearn %s: run by the demo's pool workers, with --lease FILE\n", demo.RankCommandName)
		return worker.RankExitFailed
	}
	return worker.RankExitCode(worker.RunRank(ctx, *lease))
}
