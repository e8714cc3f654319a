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
	"os"
	"os/signal"
	"syscall"

	"github.com/fleetlearn/fleetlearn/cmd/internal/workercmd"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := workercmd.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
