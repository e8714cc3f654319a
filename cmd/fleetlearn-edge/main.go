// Command fleetlearn-edge is the Fleetlearn device agent: it joins federated
// rounds over NATS and trains WASM update modules on the local dataset in
// --dataset (format: docs/DATASET.md). A device enrolls once:
//
//	fleetlearn-edge enroll --api HOST:7070 --ca ca.crt --token-file token --data-dir DIR
//	fleetlearn-edge --data-dir DIR --dataset DATA
//
// enroll presents a single-use token from an operator and stores the
// device's key, NATS credentials, NATS URL and trusted module publishers in
// DIR. Run "fleetlearn-edge --help" for every flag. SIGINT or SIGTERM stops
// the agent cleanly.
package main

import (
	"context"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"github.com/fleetlearn/fleetlearn/cmd/internal/edgecmd"
)

func main() {
	// Heap profiling samples every 512 KB allocated and keeps a 1.4 MB table of
	// stacks; the agent serves no profiles, and its model-sized buffers would be
	// sampled almost every round.
	runtime.MemProfileRate = 0
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := edgecmd.Main(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
