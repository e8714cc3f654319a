// Package servercmd is fleetlearn-server's command line, run by cmd/fleetlearn-server's
// main and, in tests, by a test binary standing in for the program
// (cmd/cmdtest).
package servercmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/fleetlearn/fleetlearn/internal/cliflags"
	"github.com/fleetlearn/fleetlearn/server"
)

// Main runs fleetlearn-server's command line args until ctx ends and
// returns the exit status, having printed any error to stderr.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRootCommand(serve)
	root.SetArgs(cliflags.SingleDash(root, args))
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "fleetlearn-server:", err)
	if isUsage(err) {
		return 2
	}
	return 1
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
	var lost error
	select {
	case <-ctx.Done():
	case lost = <-s.Lost():
		// A replica that lost its lease exits, for its supervisor to
		// restart it as a standby: starting clean is simpler to trust
		// than stepping down in place.
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Shutdown(sctx) }()
	select {
	case err := <-done:
		if err != nil {
			return errors.Join(lost, fmt.Errorf("shutdown: %w", err))
		}
		return lost
	case <-time.After(shutdownGrace + 5*time.Second):
		// A store that stopped answering (a replica cut off from its
		// database) must not keep the program from exiting: what was
		// committed is durable, and a successor's lease fences the rest.
		return errors.Join(lost, fmt.Errorf("shutdown: not finished after %v; exiting anyway", shutdownGrace))
	}
}

// shutdownGrace is what a shutdown gives open work.
const shutdownGrace = 30 * time.Second
