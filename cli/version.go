package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/fleetlearn/fleetlearn/internal/version"
	"github.com/fleetlearn/fleetlearn/wasm"
)

// versionLine is what `fleetlearn version` and `fleetlearn --version` print.
func versionLine() string {
	return version.Get().String("fleetlearn", wasm.ABIRange())
}

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit, Go version and module ABI of this binary",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), versionLine())
			return err
		},
		Example: "  fleetlearn version\n  fleetlearn --version",
	}
}
