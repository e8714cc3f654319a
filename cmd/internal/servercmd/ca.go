package servercmd

import (
	"fmt"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/smallfile"
	"github.com/fleetlearn/fleetlearn/server"
)

// newCACommand prints the server's CA certificate, which the CLI and
// enrolling devices trust: in an image without a shell (kubectl cp needs
// tar there), running the binary is the way to copy it out.
func newCACommand() *cobra.Command {
	var dataDir string
	cmd := &cobra.Command{
		Use:     "ca --data-dir DIR",
		Short:   "Print the CA certificate of the server's TLS (DIR/tls/ca.crt), for the CLI's --ca and fleetlearn-edge enroll --ca",
		Example: "  kubectl -n fleetlearn exec fleetlearn-server-0 -- fleetlearn-server ca --data-dir /var/lib/fleetlearn > ca.crt",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			path := filepath.Join(dataDir, server.TLSDir, identity.CACertFile)
			b, err := smallfile.Read(path, 64<<10)
			if err != nil {
				return fmt.Errorf("ca: %w (the server writes it at its first start)", err)
			}
			_, err = cmd.OutOrStdout().Write(b)
			return err
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", "fleetlearn-data", "the server's data directory `DIR`")
	return cmd
}
