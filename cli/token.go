package cli

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/server"
)

func newTokenCommand(_ *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Mint API bearer tokens on the server host",
	}
	cmd.AddCommand(newTokenMintCommand())
	return cmd
}

func newTokenMintCommand() *cobra.Command {
	var dataDir, subject string
	var roles []string
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "mint --data-dir DIR --subject NAME --role ROLE [--role ROLE] [--ttl 720h]",
		Short: "Mint an API token with the server's signing key and print it",
		Long: "mint reads the API signing key from the server's data directory, so it runs on the server host\n" +
			"as a user who can read that directory; it makes no call to the server. The subject names the\n" +
			"holder in the audit log. Roles: " + roleNames() + ".",
		Example: "  fleetlearn token mint --data-dir /var/lib/fleetlearn --subject olga --role operator > olga.token\n" +
			"  fleetlearn token mint --data-dir /var/lib/fleetlearn --subject ada --role auditor --ttl 24h > ada.token",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rs := make([]identity.Role, 0, len(roles))
			for _, r := range roles {
				role, err := identity.ParseRole(r)
				if err != nil {
					return fmt.Errorf("%w: --role %q: one of %s", ErrUsage, r, roleNames())
				}
				rs = append(rs, role)
			}
			if ttl <= 0 || ttl > identity.DefaultAPIMaxTTL {
				return fmt.Errorf("%w: --ttl must be in (0, %v]", ErrUsage, identity.DefaultAPIMaxTTL)
			}
			path := server.APIKeyPath(dataDir)
			pemBytes, err := os.ReadFile(path)
			if err != nil {
				return fmt.Errorf("%w: token mint: %w", ErrInput, err)
			}
			key, err := identity.ParseSigningKey(pemBytes)
			if err != nil {
				return fmt.Errorf("%w: token mint: %s: %w", ErrInput, path, err)
			}
			iss, err := identity.NewAPIIssuer(key)
			if err != nil {
				return err
			}
			tok, p, err := iss.Mint(subject, rs, ttl)
			if err != nil {
				return fmt.Errorf("%w: token mint: %w", ErrUsage, err)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "token %s for %s (%v) expires %s\n", p.TokenID, p.Subject, p.Roles,
				p.Expires.Format(time.RFC3339))
			_, err = fmt.Fprintln(cmd.OutOrStdout(), tok)
			return err
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", "", "the server's data directory (required)")
	cmd.Flags().StringVar(&subject, "subject", "", "who holds the token, as the audit log will name them (required)")
	cmd.Flags().StringSliceVar(&roles, "role", nil, "role the token grants; repeat or separate with commas (required)")
	cmd.Flags().DurationVar(&ttl, "ttl", 30*24*time.Hour, "how long the token is valid (at most 90 days)")
	for _, f := range []string{"data-dir", "subject", "role"} {
		cmd.MarkFlagRequired(f)
	}
	return cmd
}

func roleNames() string {
	s := ""
	for i, r := range identity.Roles() {
		if i > 0 {
			s += ", "
		}
		s += string(r)
	}
	return s
}
