package cli

import (
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/fleetlearn/fleetlearn/privacy/dp"
)

// dpFlags are the accounting flags shared by the dp commands.
type dpFlags struct {
	q, delta   float64
	steps      int
	accountant string
	orders     string
}

func (f *dpFlags) register(cmd *cobra.Command) {
	cmd.Flags().Float64Var(&f.q, "q", 0, "fraction of devices sampled per round, in (0, 1]; 1 without amplification (required)")
	cmd.Flags().IntVar(&f.steps, "steps", 0, "number of rounds (required)")
	cmd.Flags().Float64Var(&f.delta, "delta", 0, "delta of the (epsilon, delta) guarantee, in (0, 1) (required)")
	cmd.Flags().StringVar(&f.accountant, "accountant", "rdp", "accountant: rdp or pld")
	cmd.Flags().StringVar(&f.orders, "orders", "tfp", "RDP orders: tfp (TF-Privacy's 72) or opacus (Opacus's 151)")
	for _, name := range []string{"q", "steps", "delta"} {
		cmd.MarkFlagRequired(name)
	}
}

func (f *dpFlags) options() ([]dp.Option, dp.Accountant, error) {
	acc, err := dp.ParseAccountant(f.accountant)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %w", ErrUsage, err)
	}
	orders, err := dp.ParseOrders(f.orders)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %w", ErrUsage, err)
	}
	return []dp.Option{dp.WithAccountant(acc), dp.WithOrders(orders)}, acc, nil
}

// describe names the accounting setup for the human-readable line.
func (f *dpFlags) describe(acc dp.Accountant) string {
	if acc == dp.RDP {
		return fmt.Sprintf("rdp accountant, %s orders", f.orders)
	}
	return "pld accountant"
}

func newDPCommand(*app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dp",
		Short: "Plan differential privacy budgets (no server needed)",
	}
	cmd.AddCommand(newDPEpsilonCommand(), newDPNoiseCommand())
	return cmd
}

func newDPEpsilonCommand() *cobra.Command {
	var f dpFlags
	var z float64
	cmd := &cobra.Command{
		Use:   "epsilon --q Q --noise-multiplier Z --steps T --delta D",
		Short: "Print the epsilon of T rounds of the subsampled Gaussian mechanism",
		Long: "epsilon composes T rounds, each adding Gaussian noise of standard deviation\n" +
			"Z times the clip norm to a Poisson sample of a fraction Q of devices, and\n" +
			"prints the epsilon at the given delta. The last line is\n" +
			"'epsilon E at delta D', E in full precision.",
		Example: "  fleetlearn dp epsilon --q 0.01 --noise-multiplier 1.1 --steps 1000 --delta 1e-5\n" +
			"  fleetlearn dp epsilon --q 0.01 --noise-multiplier 1.1 --steps 1000 --delta 1e-5 --accountant pld",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts, acc, err := f.options()
			if err != nil {
				return fmt.Errorf("dp epsilon: %w", err)
			}
			eps, err := dp.Epsilon([]dp.Event{{Q: f.q, NoiseMultiplier: z, Steps: f.steps}}, f.delta, opts...)
			if err != nil {
				return fmt.Errorf("dp epsilon: %w: %w", ErrUsage, err)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "%d rounds sampling %.4g%% of devices with noise multiplier %v (%s) satisfy\n",
				f.steps, 100*f.q, z, f.describe(acc))
			_, err = fmt.Fprintf(w, "epsilon %s at delta %v\n", strconv.FormatFloat(eps, 'g', -1, 64), f.delta)
			return err
		},
	}
	f.register(cmd)
	cmd.Flags().Float64Var(&z, "noise-multiplier", 0, "noise standard deviation over the clip norm (required)")
	cmd.MarkFlagRequired("noise-multiplier")
	return cmd
}

func newDPNoiseCommand() *cobra.Command {
	var f dpFlags
	var target float64
	cmd := &cobra.Command{
		Use:   "noise --target-epsilon E --q Q --steps T --delta D",
		Short: "Find the smallest noise multiplier that meets a target epsilon",
		Long: "noise searches the smallest noise multiplier (to a relative 1e-4, rounded\n" +
			"up) at which T rounds sampling a fraction Q of devices stay within\n" +
			"(E, D). The last line is 'noise-multiplier Z for epsilon E at delta D'.",
		Example: "  fleetlearn dp noise --target-epsilon 8 --q 0.01 --steps 1000 --delta 1e-5",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts, acc, err := f.options()
			if err != nil {
				return fmt.Errorf("dp noise: %w", err)
			}
			z, err := dp.NoiseMultiplier(target, f.delta, f.q, f.steps, opts...)
			if err != nil {
				return fmt.Errorf("dp noise: %w: %w", ErrUsage, err)
			}
			eps, err := dp.Epsilon([]dp.Event{{Q: f.q, NoiseMultiplier: z, Steps: f.steps}}, f.delta, opts...)
			if err != nil {
				return fmt.Errorf("dp noise: %w", err)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "%d rounds sampling %.4g%% of devices (%s) reach epsilon %.6g\n",
				f.steps, 100*f.q, f.describe(acc), eps)
			_, err = fmt.Fprintf(w, "noise-multiplier %s for epsilon %v at delta %v\n",
				strconv.FormatFloat(z, 'g', -1, 64), target, f.delta)
			return err
		},
	}
	f.register(cmd)
	cmd.Flags().Float64Var(&target, "target-epsilon", 0, "epsilon to stay within (required)")
	cmd.MarkFlagRequired("target-epsilon")
	return cmd
}
