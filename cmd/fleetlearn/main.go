// Command fleetlearn is the Fleetlearn operator CLI: it creates and watches
// federated training tasks and manages models and WASM update modules on an
// aggregator. Run "fleetlearn --help" for the commands.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/fleetlearn/fleetlearn/cmd/internal/clicmd"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := clicmd.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
