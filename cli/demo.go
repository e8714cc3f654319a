package cli

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/fleetlearn/fleetlearn/demo"
)

func newDemoCommand(a *app) *cobra.Command {
	cfg := demo.Defaults
	var (
		verbose bool
		sweep   []float64
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the whole system in one process: aggregator, edge fleet, MNIST fine-tuning",
		Long: "demo starts an aggregator (embedded NATS, SQLite), a fleet of edge agents that talk to it\n" +
			"over NATS, splits MNIST non-IID across them, pretrains a base model in the cloud on a\n" +
			"small public slice and runs federated fine-tuning rounds, printing test accuracy per\n" +
			"round. It writes results.csv and accuracy.png to --out-dir.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.Out = cmd.OutOrStdout()
			cfg.Terminal = a.isTerminal(cmd.OutOrStdout())
			if verbose {
				cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
			}
			if len(sweep) > 0 {
				if _, err := demo.Sweep(cmd.Context(), cfg, sweep); err != nil {
					return fmt.Errorf("demo: %w", err)
				}
				return nil
			}
			if _, err := demo.Run(cmd.Context(), cfg); err != nil {
				return fmt.Errorf("demo: %w", err)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Edges, "edges", cfg.Edges, "edge agents in the simulated fleet")
	f.IntVar(&cfg.Rounds, "rounds", cfg.Rounds, "federated training rounds")
	f.IntVar(&cfg.Cohort, "cohort", cfg.Cohort, "reports per round (devices selected: 30% more)")
	f.Float64Var(&cfg.Alpha, "alpha", cfg.Alpha, "Dirichlet concentration of the label skew (smaller is more skewed)")
	f.IntVar(&cfg.BaseExamples, "base-examples", cfg.BaseExamples, "public examples the cloud pretrains the base model on")
	f.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed for the data split, initialisation and training")
	f.BoolVar(&cfg.SecureAggregation, "secure-aggregation", false, "run training rounds through SecAgg+ secure aggregation")
	f.Float64Var(&cfg.Dropout, "secagg-dropout", cfg.Dropout, "with --secure-aggregation, chance that a selected device vanishes after uploading its keys")
	f.StringVar(&cfg.DP, "dp", "", `differential privacy: "central" (server-side noise) or "distributed" (device-side discrete Gaussian under secure aggregation)`)
	f.Float64Var(&cfg.NoiseMultiplier, "noise-multiplier", cfg.NoiseMultiplier, "with --dp, noise standard deviation over the clip norm")
	f.Float64Var(&cfg.ClipNorm, "clip-norm", cfg.ClipNorm, "with --dp, L2 bound of each device's update")
	f.Float64Var(&cfg.DPDelta, "dp-delta", cfg.DPDelta, "with --dp, delta of the (epsilon, delta) guarantee")
	f.Float64SliceVar(&sweep, "dp-sweep", nil, "with --dp, run once without DP and once per noise multiplier listed, and plot accuracy against epsilon (privacy.png)")
	f.StringVar(&cfg.DataDir, "data-dir", "", "keep the server's state (SQLite, JetStream, blobs) here instead of a temporary directory")
	f.StringVar(&cfg.OutDir, "out-dir", cfg.OutDir, "directory for results.csv and accuracy.png")
	f.BoolVarP(&verbose, "verbose", "v", false, "log the server's and agents' events to stderr")
	return cmd
}
