package main

import (
	"github.com/spf13/cobra"

	"github.com/fleetlearn/fleetlearn/internal/healthcheck"
	"github.com/fleetlearn/fleetlearn/server"
)

// newHealthCommand asks a running server's /readyz (or /healthz), for
// probes that can only run a program: Docker's HEALTHCHECK in an image
// without a shell, Kubernetes exec probes, systemd watchdogs.
func newHealthCommand() *cobra.Command {
	var addr string
	var live bool
	cmd := &cobra.Command{
		Use:   "health",
		Short: "Exit 0 if the server on this host is ready (GET /readyz on --metrics-addr), 1 with the reason if not",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			path := server.ReadyzPath
			if live {
				path = server.HealthzPath
			}
			return healthcheck.Get(cmd.Context(), addr, path, cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "127.0.0.1:9464", "the server's --metrics-addr `ADDR` (host:port)")
	cmd.Flags().BoolVar(&live, "live", false, "ask /healthz (the process serves) instead of /readyz (it can run rounds)")
	return cmd
}
