package cli

import (
	"context"
	"fmt"
	"io"
	"slices"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/fleetlearn/fleetlearn/audit"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

func newAuditKeysCommand(a *app) *cobra.Command {
	var output, dataDir string
	var witnesses []string
	cmd := &cobra.Command{
		Use:   "keys [--server ADDR | --data-dir DIR] [--witness KEY]... [-o FILE]",
		Short: "Print the audit log's public keys and fingerprints, for auditors to pin",
		Long: "keys prints the log's origin, entry key (a JWKS and its RFC 7638 thumbprint) and checkpoint\n" +
			"verifier key, with the SHA-256 fingerprints of both keys, as a pin file that audit verify\n" +
			"--pin reads. An auditor should get it once, compare the fingerprints with the operator over a\n" +
			"second channel, and keep it: from then on a server that changes its keys fails to verify.\n" +
			"From a server it lists the witnesses the server accepts; --witness adds one (its verifier\n" +
			"key, from audit witness init), such as one the auditor runs. verify --pin requires a fresh\n" +
			"cosignature of each.",
		Example: `  fleetlearn audit keys -o audit.pin
  fleetlearn audit keys --data-dir /var/lib/fleetlearn --witness 'witness.example.org+5b1d0c2e+BMw...' -o audit.pin
  fleetlearn audit verify audit.jsonl --pin audit.pin`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dataDir != "" && cmd.Flag("server").Changed {
				return fmt.Errorf("%w: --server and --data-dir cannot be used together", ErrUsage)
			}
			for _, w := range witnesses {
				if err := audit.CheckWitnessKey(w); err != nil {
					return fmt.Errorf("%w: --witness: %w", ErrUsage, err)
				}
			}
			write := func(w io.Writer, pub audit.PublicKeys, served []string) error {
				ws := slices.Clone(served)
				for _, k := range witnesses {
					if !slices.Contains(ws, k) {
						ws = append(ws, k)
					}
				}
				b, err := audit.Pin{PublicKeys: pub, Witnesses: ws}.MarshalText()
				if err != nil {
					return fmt.Errorf("%w: %w", ErrProtocol, err)
				}
				// What is printed must read back: a server sending keys
				// that disagree with each other fails here, not later.
				if _, err := audit.ParsePin(b); err != nil {
					return fmt.Errorf("%w: the log's keys: %w", ErrProtocol, err)
				}
				_, err = w.Write(b)
				return err
			}
			return writeFile(cmd, output, 0o644, func(w io.Writer) error {
				if dataDir != "" {
					ctx := cmd.Context()
					if ctx == nil {
						ctx = context.Background()
					}
					lg, err := audit.OpenReadOnly(ctx, dataDir)
					if err != nil {
						return fmt.Errorf("%w: %w", ErrInput, err)
					}
					defer lg.Close()
					return write(w, lg.PublicKeys(), nil)
				}
				return a.call(cmd, false, func(ctx context.Context, conn *grpc.ClientConn) error {
					res, err := apiv1.NewAuditServiceClient(conn).GetPublicKeys(ctx, &pb.GetPublicKeysRequest{})
					if err != nil {
						return err
					}
					entry, err := audit.ParseJWKS(res.GetEntryJwks())
					if err != nil {
						return fmt.Errorf("%w: server's entry key: %w", ErrProtocol, err)
					}
					return write(w, audit.PublicKeys{Origin: res.GetOrigin(), Entry: entry, EntryKeyID: res.GetEntryKeyId(),
						VerifierKey: res.GetCheckpointVerifierKey()}, res.GetWitnessVerifierKeys())
				})
			})
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "file to write; standard output when empty or -")
	cmd.Flags().StringVar(&dataDir, "data-dir", "", "read the keys of a stopped server's data directory instead")
	cmd.Flags().StringArrayVar(&witnesses, "witness", nil, "verifier key of a witness to require; repeatable")
	return cmd
}
