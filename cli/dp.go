package cli

import (
	"fmt"
	"math"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/fleetlearn/fleetlearn/privacy/dp"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/privacyconf"
)

// dpFlags are the accounting flags shared by the dp commands.
type dpFlags struct {
	q, delta   float64
	steps      int
	accountant string
	orders     string
	// mechanism is gaussian (independent noise each round), tree or blt
	// (noise correlated across rounds, DP-FTRL); the correlated ones take
	// no sampling and limit each device to maxParts rounds, minSep apart.
	mechanism        string
	maxParts, minSep int
	// rho1 and rhoWhat cache correlatedRho: a BLT is fitted once.
	rho1    float64
	rhoWhat string
}

// Mechanisms of --mechanism.
const (
	mechGaussian = "gaussian"
	mechTree     = "tree"
	mechBLT      = "blt"
)

func (f *dpFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.mechanism, "mechanism", mechGaussian, "gaussian (independent noise each round, with --q), tree (tree aggregation) "+
		"or blt (a buffered linear Toeplitz factorization fitted to --rounds, --max-participations and --min-separation): "+
		"tree and blt add noise correlated across rounds (DP-FTRL) and assume no sampling")
	fl.Float64Var(&f.q, "q", 0, "with --mechanism gaussian, fraction of devices sampled per round, in (0, 1]; 1 without amplification (required)")
	fl.IntVar(&f.steps, "rounds", 0, "number of training rounds (required; --steps is the same)")
	fl.IntVar(&f.steps, "steps", 0, "number of rounds (the same as --rounds)")
	fl.Float64Var(&f.delta, "delta", 0, "delta of the (epsilon, delta) guarantee, in (0, 1) (required)")
	fl.IntVar(&f.maxParts, "max-participations", 1, "with --mechanism tree or blt, rounds one device may take part in (the task's --dp-max-rounds-per-device)")
	fl.IntVar(&f.minSep, "min-separation", 1, "with --mechanism tree or blt, rounds between two a device takes part in: it may return this many rounds after its last (the task's --dp-min-separation)")
	fl.StringVar(&f.accountant, "accountant", "rdp", "with --mechanism gaussian, accountant: rdp or pld")
	fl.StringVar(&f.orders, "orders", "tfp", "RDP orders: tfp (TF-Privacy's 72) or opacus (Opacus's 151, those of TF-Privacy's tree accounting)")
	cmd.MarkFlagRequired("delta")
}

// check refuses flags that do not fit the mechanism.
func (f *dpFlags) check(cmd *cobra.Command) error {
	changed := cmd.Flags().Changed
	if f.steps <= 0 {
		return fmt.Errorf("%w: give --rounds, the number of training rounds (at least 1)", ErrUsage)
	}
	switch f.mechanism {
	case mechGaussian:
		if !changed("q") {
			return fmt.Errorf("%w: --mechanism gaussian needs --q, the fraction of devices sampled per round (1 without amplification)", ErrUsage)
		}
		if changed("min-separation") {
			return fmt.Errorf("%w: --min-separation applies to --mechanism tree or blt", ErrUsage)
		}
		if changed("max-participations") && (f.q != 1 || f.maxParts < 1) {
			return fmt.Errorf("%w: --max-participations with --mechanism gaussian needs --q 1 and a cap of at least 1", ErrUsage)
		}
	case mechTree, mechBLT:
		if changed("q") && f.q != 1 {
			return fmt.Errorf("%w: --mechanism %s assumes no sampling: drop --q (or give 1)", ErrUsage, f.mechanism)
		}
		if changed("accountant") && f.accountant != "rdp" {
			return fmt.Errorf("%w: --mechanism %s accounts in zCDP, converted as RDP: drop --accountant", ErrUsage, f.mechanism)
		}
		if f.steps > privacyconf.MaxCorrelatedRounds {
			return fmt.Errorf("%w: --mechanism %s is laid out over at most %d rounds, as tasks are", ErrUsage, f.mechanism, privacyconf.MaxCorrelatedRounds)
		}
		if f.maxParts < 1 || f.minSep < 1 {
			return fmt.Errorf("%w: --max-participations and --min-separation must be at least 1", ErrUsage)
		}
		if f.maxParts > 1 && (f.maxParts-1)*f.minSep >= f.steps {
			return fmt.Errorf("%w: %d participations %d rounds apart do not fit %d rounds: lower --max-participations", ErrUsage, f.maxParts, f.minSep, f.steps)
		}
	default:
		return fmt.Errorf("%w: --mechanism %q (want gaussian, tree or blt)", ErrUsage, f.mechanism)
	}
	return nil
}

// correlatedRho is the ρ-zCDP of the tree or blt mechanism at noise
// multiplier 1 (ρ scales as 1/z²), with a line describing it: a task's
// accounting (privacyconf.Correlated) for these limits.
func (f *dpFlags) correlatedRho() (float64, string, error) {
	noise := map[string]pb.DPNoise{mechTree: pb.DPNoise_DP_NOISE_TREE, mechBLT: pb.DPNoise_DP_NOISE_BLT}[f.mechanism]
	c, err := privacyconf.NewCorrelated(noise, f.steps, f.maxParts, f.minSep)
	if err != nil {
		return 0, "", err
	}
	rho, err := c.Rho(1, f.steps)
	if err != nil || f.mechanism == mechTree {
		return rho, "tree aggregation", err
	}
	sens, err := c.BLT.Sensitivity(f.steps, f.maxParts, f.minSep)
	return rho, fmt.Sprintf("a fitted %d-buffer BLT (sensitivity %.4g)", privacyconf.BLTBuffers, sens), err
}

// correlatedEpsilon is ε at noise multiplier z of the tree or blt mechanism.
func (f *dpFlags) correlatedEpsilon(z float64) (eps float64, what string, err error) {
	if !(z > 0) || math.IsInf(z, 0) {
		return 0, "", fmt.Errorf("%w: --noise-multiplier %v, want a positive number", ErrUsage, z)
	}
	if f.rhoWhat == "" {
		if f.rho1, f.rhoWhat, err = f.correlatedRho(); err != nil {
			return 0, "", fmt.Errorf("%w: %w", ErrUsage, err)
		}
	}
	rho1, what := f.rho1, f.rhoWhat
	orders, err := dp.ParseOrders(f.orders)
	if err != nil {
		return 0, "", fmt.Errorf("%w: %w", ErrUsage, err)
	}
	eps, _, err = dp.EpsilonFromZCDP(rho1/(z*z), f.delta, orders)
	if err != nil {
		return 0, "", fmt.Errorf("%w: %w", ErrUsage, err)
	}
	limits := "each device in one round at most"
	if f.maxParts > 1 {
		limits = fmt.Sprintf("each device in at most %d rounds, %d or more apart", f.maxParts, f.minSep)
	}
	return eps, fmt.Sprintf("%s, %s, %s orders", what, limits, f.orders), nil
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
		Use:   "epsilon [--mechanism gaussian|tree|blt] --noise-multiplier Z --rounds T --delta D",
		Short: "Print the epsilon of T rounds of a Gaussian, tree-aggregation or BLT mechanism",
		Long: "epsilon composes T rounds, each adding Gaussian noise of standard deviation\n" +
			"Z times the clip norm to a Poisson sample of a fraction Q of devices, and\n" +
			"prints the epsilon at the given delta. With --mechanism tree or blt the\n" +
			"noise is correlated across rounds (DP-FTRL): no sampling is assumed, and a\n" +
			"device takes part in at most --max-participations rounds, --min-separation\n" +
			"apart, as the task's --dp-max-rounds-per-device and --dp-min-separation\n" +
			"enforce. The last line is 'epsilon E at delta D', E in full precision.",
		Example: "  fleetlearn dp epsilon --q 0.01 --noise-multiplier 1.1 --rounds 1000 --delta 1e-5\n" +
			"  fleetlearn dp epsilon --q 0.01 --noise-multiplier 1.1 --rounds 1000 --delta 1e-5 --accountant pld\n" +
			"  fleetlearn dp epsilon --mechanism blt --noise-multiplier 4 --rounds 1000 --max-participations 4 --min-separation 250 --delta 1e-6",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.check(cmd); err != nil {
				return fmt.Errorf("dp epsilon: %w", err)
			}
			w := cmd.OutOrStdout()
			if f.mechanism != mechGaussian {
				eps, what, err := f.correlatedEpsilon(z)
				if err != nil {
					return fmt.Errorf("dp epsilon: %w", err)
				}
				fmt.Fprintf(w, "%d rounds of correlated noise with noise multiplier %v (%s) satisfy\n", f.steps, z, what)
				_, err = fmt.Fprintf(w, "epsilon %s at delta %v\n", strconv.FormatFloat(eps, 'g', -1, 64), f.delta)
				return err
			}
			opts, acc, err := f.options()
			if err != nil {
				return fmt.Errorf("dp epsilon: %w", err)
			}
			eps, err := dp.Epsilon([]dp.Event{{Q: f.q, NoiseMultiplier: z, Steps: f.gaussianSteps(cmd)}}, f.delta, opts...)
			if err != nil {
				return fmt.Errorf("dp epsilon: %w: %w", ErrUsage, err)
			}
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
		Use:   "noise --target-epsilon E [--mechanism gaussian|tree|blt] --rounds T --delta D",
		Short: "Find the smallest noise multiplier that meets a target epsilon",
		Long: "noise searches the smallest noise multiplier (to a relative 1e-4, rounded\n" +
			"up) at which T rounds sampling a fraction Q of devices stay within\n" +
			"(E, D). The last line is 'noise-multiplier Z for epsilon E at delta D'.",
		Example: "  fleetlearn dp noise --target-epsilon 8 --q 0.01 --rounds 1000 --delta 1e-5\n" +
			"  fleetlearn dp noise --target-epsilon 2 --mechanism tree --rounds 1000 --max-participations 4 --min-separation 250 --delta 1e-6",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.check(cmd); err != nil {
				return fmt.Errorf("dp noise: %w", err)
			}
			if f.mechanism != mechGaussian {
				z, eps, what, err := f.correlatedNoise(target)
				if err != nil {
					return fmt.Errorf("dp noise: %w", err)
				}
				w := cmd.OutOrStdout()
				fmt.Fprintf(w, "%d rounds of correlated noise (%s) reach epsilon %.6g\n", f.steps, what, eps)
				_, err = fmt.Fprintf(w, "noise-multiplier %s for epsilon %v at delta %v\n",
					strconv.FormatFloat(z, 'g', -1, 64), target, f.delta)
				return err
			}
			opts, acc, err := f.options()
			if err != nil {
				return fmt.Errorf("dp noise: %w", err)
			}
			z, err := dp.NoiseMultiplier(target, f.delta, f.q, f.gaussianSteps(cmd), opts...)
			if err != nil {
				return fmt.Errorf("dp noise: %w: %w", ErrUsage, err)
			}
			eps, err := dp.Epsilon([]dp.Event{{Q: f.q, NoiseMultiplier: z, Steps: f.gaussianSteps(cmd)}}, f.delta, opts...)
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

// correlatedNoise is the smallest noise multiplier (to a relative 1e-4,
// rounded up) at which the tree or blt mechanism stays within target, and
// the ε it reaches. ε falls as z grows, since ρ is ρ(1)/z².
func (f *dpFlags) correlatedNoise(target float64) (z, eps float64, what string, err error) {
	if !(target > 0) || math.IsInf(target, 0) {
		return 0, 0, "", fmt.Errorf("%w: --target-epsilon %v, want a positive number", ErrUsage, target)
	}
	lo, hi := 1e-3, 1.0
	for {
		if eps, what, err = f.correlatedEpsilon(hi); err != nil {
			return 0, 0, "", err
		}
		if eps <= target {
			break
		}
		if lo, hi = hi, 2*hi; hi > 1e6 {
			return 0, 0, "", fmt.Errorf("%w: %w: no noise multiplier up to 1e6 reaches epsilon %v", ErrUsage, dp.ErrUnreachable, target)
		}
	}
	for hi-lo > 1e-4*hi {
		mid := (lo + hi) / 2
		e, _, err := f.correlatedEpsilon(mid)
		if err != nil {
			return 0, 0, "", err
		}
		if e <= target {
			hi = mid
		} else {
			lo = mid
		}
	}
	eps, what, err = f.correlatedEpsilon(hi)
	return hi, eps, what, err
}

// gaussianSteps is the rounds independent noise composes over for one
// device: all of them, or with a participation cap (and no sampling) the
// cap's.
func (f *dpFlags) gaussianSteps(cmd *cobra.Command) int {
	if cmd.Flags().Changed("max-participations") {
		return min(f.steps, f.maxParts)
	}
	return f.steps
}
