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
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
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
