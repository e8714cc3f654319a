package cli

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/fleetlearn/fleetlearn/demo"
	"github.com/fleetlearn/fleetlearn/internal/tracing"
)

func newDemoCommand(a *app) *cobra.Command {
	cfg := demo.Defaults
	lmCfg := demo.LMDefaults
	var (
		verbose bool
		sweep   []float64
		task    string
	)
	traceCfg := tracing.Config{ServiceName: "fleetlearn-demo", OTLPFromEnv: true}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the whole system in one process: aggregator, edge fleet, MNIST fine-tuning",
		Long: "demo starts an aggregator (embedded NATS, SQLite), a fleet of edge agents that talk to it\n" +
			"over NATS, splits MNIST non-IID across them, pretrains a base model in the cloud on a\n" +
			"small public slice and runs federated fine-tuning rounds, printing test accuracy per\n" +
			"round. It needs no Go toolchain and no source tree: the update module ships inside\n" +
			"fleetlearn. It writes results.csv and accuracy.png (privacy.csv and privacy.png with\n" +
			"--dp-sweep) into the directory --out, which it creates.\n\n" +
			"With --task lm it runs federated code completion instead: a small transformer is pretrained\n" +
			"on the pool on the public packages of the Go standard library's source (--goroot), then\n" +
			"fine-tuned by devices that each hold one private package, fully and with LoRA adapters; it\n" +
			"prints held-out loss and next-token accuracy before and after and the bytes each report\n" +
			"sent, and writes lm.csv and lm.png.",
		Example: "  fleetlearn demo\n  fleetlearn demo --edges 20 --rounds 5 --cohort 10 --out /tmp/demo\n" +
			"  fleetlearn demo --secure-aggregation --dp distributed\n  fleetlearn demo --task lm",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			// One provider for the server and the in-process agents: one
			// trace per round, in one file or collector.
			tp, flush, err := tracing.Setup(cmd.Context(), traceCfg)
			if err != nil {
				return fmt.Errorf("%w: %w", ErrUsage, err)
			}
			defer func() {
				ctx, cancel := context.WithTimeout(context.WithoutCancel(cmd.Context()), 10*time.Second)
				defer cancel()
				if ferr := flush(ctx); ferr != nil && err == nil {
					err = ferr
				}
			}()
			cfg.Tracer = tp
			cfg.Out = cmd.OutOrStdout()
			// Log lines on the same terminal would tear the redrawn bars.
			cfg.Terminal = a.isTerminal(cmd.OutOrStdout()) && !verbose
			if verbose {
				cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
			}
			// The demo's errors name it already.
			switch task {
			case "mnist":
			case "lm":
				if len(sweep) > 0 || cfg.SecureAggregation || cfg.DP != "" {
					return fmt.Errorf("%w: --task lm runs without --secure-aggregation, --dp and --dp-sweep", ErrUsage)
				}
				changed := cmd.Flags().Changed
				if changed("edges") {
					lmCfg.Edges = cfg.Edges
				}
				if changed("rounds") {
					lmCfg.Rounds = cfg.Rounds
				}
				if changed("cohort") {
					lmCfg.Cohort = cfg.Cohort
				}
				if changed("seed") {
					lmCfg.Seed = cfg.Seed
				}
				lmCfg.DataDir, lmCfg.OutDir, lmCfg.Out, lmCfg.Log, lmCfg.Terminal = cfg.DataDir, cfg.OutDir, cfg.Out, cfg.Log, cfg.Terminal
				lmCfg.Tracer, lmCfg.UI = tp, cfg.UI
				_, err := demo.RunLM(cmd.Context(), lmCfg)
				return err
			default:
				return fmt.Errorf("%w: --task %q: want mnist or lm", ErrUsage, task)
			}
			if len(sweep) > 0 {
				if cfg.UI != "" {
					return fmt.Errorf("%w: --ui serves one run's dashboard; --dp-sweep runs several: drop one of them", ErrUsage)
				}
				_, err := demo.Sweep(cmd.Context(), cfg, sweep)
				return err
			}
			_, err = demo.Run(cmd.Context(), cfg)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&task, "task", "mnist", "what the fleet learns: mnist (digit classification, an MLP) or lm (code completion on Go source, a transformer)")
	f.IntVar(&lmCfg.LoRARank, "lora-rank", lmCfg.LoRARank, "with --task lm, rank of the LoRA task's adapters")
	f.StringVar(&lmCfg.GoRoot, "goroot", "", "with --task lm, the Go installation whose source is the corpus (default: the one fleetlearn was built with, or the copy of its source built into fleetlearn where it is gone)")
	f.IntVar(&cfg.Edges, "edges", cfg.Edges, "edge agents in the simulated fleet (--task lm: 8)")
	f.IntVar(&cfg.Rounds, "rounds", cfg.Rounds, "federated training rounds (--task lm: 4 per task)")
	f.IntVar(&cfg.Cohort, "cohort", cfg.Cohort, "devices selected per round, a round can commit with 3/4 of them reporting (--task lm: 4)")
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
	f.Var(encodingFlag{&cfg.UpdateEncoding}, "update-encoding", "how devices send updates: none (float32), int8 or int4 (plaintext only)")
	f.StringVar(&cfg.DataDir, "data-dir", "", "keep the server's state (SQLite, JetStream, blobs) here instead of a temporary directory")
	f.StringVar(&cfg.OutDir, "out", cfg.OutDir, "directory for all of the demo's results, created if missing")
	f.StringVar(&cfg.OutDir, "out-dir", cfg.OutDir, "directory for all of the demo's results")
	f.MarkDeprecated("out-dir", "use --out")
	f.BoolVarP(&verbose, "verbose", "v", false, "log the server's and agents' events to stderr")
	f.StringVar(&cfg.UI, "ui", "", "serve the web dashboard on `ADDR` (e.g. 127.0.0.1:8443), print its sign-in link, and keep serving after the run until interrupted")
	tracing.AddFlags(f, &traceCfg)
	hideGlobalFlags(cmd)
	return cmd
}

// hideGlobalFlags leaves the root's flags (--server, --token-file, ...) out
// of the usage of a command that never talks to a server. The flags are
// shared with every other command, so they are hidden only while the usage
// is drawn.
func hideGlobalFlags(cmd *cobra.Command) {
	cmd.SetUsageFunc(func(c *cobra.Command) error {
		var hidden []*pflag.Flag
		c.InheritedFlags().VisitAll(func(f *pflag.Flag) {
			if !f.Hidden {
				f.Hidden = true
				hidden = append(hidden, f)
			}
		})
		defer func() {
			for _, f := range hidden {
				f.Hidden = false
			}
		}()
		return c.Parent().UsageFunc()(c)
	})
}
