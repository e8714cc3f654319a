// Command fleetlearn-server is the Fleetlearn cloud aggregator service. By
// default it embeds a NATS server with JetStream and keeps all state under
// --data-dir; --nats-url points it at an external NATS cluster instead.
//
// The gRPC API serves TLS from a CA the server creates in
// <data-dir>/tls (clients trust tls/ca.crt) and requires bearer tokens; on
// first start the server writes an admin token to <data-dir>/admin.token.
// --public-host opens the API and NATS to other hosts. --module-publishers
// names the JWK Set of the publisher keys whose modules it accepts. Run
// "fleetlearn-server --help" for every flag.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/fleetlearn/fleetlearn/internal/cliflags"
	"github.com/fleetlearn/fleetlearn/server"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	root := newRootCommand(serve)
	root.SetArgs(cliflags.SingleDash(root, os.Args[1:]))
	err := root.ExecuteContext(ctx)
	stop()
	if err == nil {
		return
	}
	fmt.Fprintln(os.Stderr, "fleetlearn-server:", err)
	if isUsage(err) {
		os.Exit(2)
	}
	os.Exit(1)
}

// serve starts the aggregator and runs it until ctx ends, then shuts it
// down, giving open work 30 seconds.
func serve(ctx context.Context, cfg server.Config, log *slog.Logger, opts ...server.Option) error {
	log.Info("starting", "version", versionLine())
	s, err := server.New(cfg, append([]server.Option{server.WithLogger(log)}, opts...)...)
	if err != nil {
		return usage("%w", err) // New only checks the configuration
	}
	if err := s.Start(ctx); err != nil {
		if ctx.Err() != nil {
			// Stopped on purpose while waiting for NATS: not a failure.
			log.Info("stopped before the start completed", "reason", err)
			return nil
		}
		return fmt.Errorf("start: %w", err)
	}
	<-ctx.Done()
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := s.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}
