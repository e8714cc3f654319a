package edgecmd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/fleetlearn/fleetlearn/internal/healthcheck"
)

// serveHealth serves /healthz and /readyz on addr until stop is called.
func serveHealth(addr string, ready func(context.Context) error) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--health-addr: %w", err)
	}
	mux := http.NewServeMux()
	healthcheck.Register(mux, ready)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			ln.Close()
		}
	}()
	return func() { srv.Close() }, nil
}

// newHealthCommand asks a running agent's /readyz, for probes that can
// only run a program, such as Docker's HEALTHCHECK in an image without a
// shell.
func newHealthCommand() *cobra.Command {
	cmd := healthcheck.Command(
		"Exit 0 if the agent on this host is connected (GET /readyz on its --health-addr), 1 with the reason if not",
		"", "the agent's --health-addr `ADDR` (host:port)",
		"it is connected to NATS", "the process runs")
	cmd.Example = `  # an agent run with --health-addr 127.0.0.1:9465
  fleetlearn-edge health --addr 127.0.0.1:9465
  fleetlearn-edge health --addr 127.0.0.1:9465 --live

  # Docker, in an image without a shell
  HEALTHCHECK CMD ["fleetlearn-edge", "health", "--addr", "127.0.0.1:9465"]`
	return cmd
}
