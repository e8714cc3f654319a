// Command fleetlearn is the Fleetlearn operator CLI: it creates and watches
// federated training tasks and manages models and WASM update modules on an
// aggregator. Run "fleetlearn --help" for the commands.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/fleetlearn/fleetlearn/cli"
	"github.com/fleetlearn/fleetlearn/demo"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	if len(os.Args) > 1 && os.Args[1] == demo.RankCommandName {
		// The demo's embedded pool workers run their ranks as children of
		// this binary; the outcome is the exit status the worker reads.
		code := demo.RankMain(ctx, os.Args[2:])
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
