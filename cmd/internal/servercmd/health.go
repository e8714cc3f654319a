package servercmd

import (
	"github.com/spf13/cobra"

	"github.com/fleetlearn/fleetlearn/internal/healthcheck"
)

// newHealthCommand asks a running server's /readyz, for probes that can
// only run a program: Docker's HEALTHCHECK in an image without a shell,
// Kubernetes exec probes, monitoring on the host.
func newHealthCommand() *cobra.Command {
	cmd := healthcheck.Command(
		"Exit 0 if the server on this host is ready (GET /readyz on its --metrics-addr), 1 with the reason if not",
		"127.0.0.1:9464", "the server's --metrics-addr `ADDR` (host:port)",
		"it can run rounds", "the process serves")
	cmd.Example = `  fleetlearn-server health
  fleetlearn-server health --addr 127.0.0.1:9464 --live

  # Docker, in an image without a shell
  HEALTHCHECK CMD ["fleetlearn-server", "health"]`
	return cmd
}
