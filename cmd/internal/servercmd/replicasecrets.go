package servercmd

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/fleetlearn/fleetlearn/server"
)

// newReplicaSecretsCommand creates the secrets the replicas of a replicated
// aggregator share before any replica runs: in a cluster whose image has
// no shell, copying them out of the first replica's volume is not an
// option.
func newReplicaSecretsCommand() *cobra.Command {
	var dataDir string
	cmd := &cobra.Command{
		Use:   "replica-secrets --data-dir DIR",
		Short: "Create the secrets every replica shares (TLS CA, token keys, admin token, NATS and audit keys) in DIR, without starting a server",
		Long: `replica-secrets creates in DIR what a server's first start creates and every
replica of a replicated aggregator (--store) must hold the same copy of:
` + strings.Join(server.ReplicaSecrets, ", ") + `.
Files already in DIR are kept. Give every replica a copy with --secrets-from
(and --nats-auth-from DIR/nats-auth), or as the Secrets of deploy/README.md,
and keep DIR offline: whoever reads it can mint any API token.`,
		Example: `  fleetlearn-server replica-secrets --data-dir fleetlearn-replica
  fleetlearn-server --data-dir fleetlearn-replica --write-nats-config fleetlearn-auth.conf --nats-resolver-dir /data/jwt`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dataDir == "" {
				return usage("replica-secrets: give --data-dir DIR, the directory to create the secrets in")
			}
			if err := server.WriteReplicaSecrets(cmd.Context(), dataDir); err != nil {
				return fmt.Errorf("replica-secrets: %w", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s holds the secrets every replica shares: start each replica with --secrets-from %s "+
				"(or create the Secrets of deploy/README.md from it), and keep the directory offline\n",
				dataDir, filepath.Clean(dataDir))
			return nil
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", "", "create the secrets in `DIR` (made if missing)")
	return cmd
}
