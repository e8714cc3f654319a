package edgecmd

import (
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/fleetlearn/fleetlearn/edge"
	"github.com/fleetlearn/fleetlearn/internal/cliflags"
	"github.com/fleetlearn/fleetlearn/internal/tracing"
	"github.com/fleetlearn/fleetlearn/internal/version"
	"github.com/fleetlearn/fleetlearn/wasm"
)

// usage makes an error that is the command line's fault (exit status 2).
func usage(format string, a ...any) error { return cliflags.Usage(format, a...) }

// isUsage reports whether err is the command line's fault.
func isUsage(err error) bool { return cliflags.IsUsage(err) }

// versionLine names the build and the WASM engine it trains with: the
// compiler on amd64 and arm64, the much slower interpreter elsewhere
// (32-bit arm), which an operator sizing a task for a fleet must know.
func versionLine() string {
	return version.Get().String("fleetlearn-edge", "wasm "+wasm.Engine(), wasm.ABIRange())
}

const long = `fleetlearn-edge is the Fleetlearn device agent. It checks in with the
aggregator (fleetlearn-server) over NATS; when the device is selected for a
round it downloads the round's model and WASM update module (checked against
their sha256, and the module against the trusted publishers' signatures),
runs the module in the sandbox on the local dataset in --dataset
(docs/DATASET.md), and reports the update, signed with the device key.

A device enrolls once, with the server's CA certificate (its
<data-dir>/tls/ca.crt) and a single-use token from 'fleetlearn device token':
  fleetlearn-edge enroll --api HOST:7070 --ca ca.crt --token-file token --data-dir DIR
Enrollment keeps in DIR the device key (device.nk), its NATS credentials
(device.creds), the NATS URL (nats-url), the CA (ca.pem) and the trusted
module publishers (publishers.jwks); the agent then runs from the same DIR,
where it also keeps its download and compilation caches.

While the aggregator cannot be reached the agent keeps trying, with back-off,
and warns. It stops when it cannot go on without the operator: the device is
not enrolled, or NATS refuses or revokes its credentials.

Exit status: 0 stopped by SIGINT or SIGTERM; 1 failed; 2 command-line error;
3 needs the operator (not enrolled, revoked, enrollment token or key
refused), so restarting will not help.

Flags may also be written with one dash (-data-dir DIR), as in earlier
releases.`

const examples = `  # once: enroll with a token from 'fleetlearn device token' and the server's tls/ca.crt
  fleetlearn-edge enroll --api aggregator.example.net:7070 --ca ca.crt --token-file token \
    --data-dir /var/lib/fleetlearn-edge

  # then run the agent on the device's dataset
  fleetlearn-edge --data-dir /var/lib/fleetlearn-edge --dataset /var/lib/fleetlearn-edge/dataset

  # join only some tasks, report a device class, and log every protocol step
  fleetlearn-edge --data-dir /var/lib/fleetlearn-edge --dataset DATA --tasks t-1,t-2 \
    --device-class gateway --log-level debug`

// flags are the agent's command line.
type flags struct {
	cfg                edge.Config
	tasks, level, pubs string
	procs              int
	healthAddr         string
	trace              tracing.Config
}

// newRootCommand is the fleetlearn-edge command; agent runs the agent.
// Errors are returned from Execute, not printed.
func newRootCommand(agent agentFunc) *cobra.Command {
	f := &flags{}
	root := &cobra.Command{
		Use:           "fleetlearn-edge --dataset DIR [--data-dir DIR] [flags]",
		Short:         "Run the Fleetlearn device agent: train on local data in federated rounds",
		Long:          long,
		Example:       examples,
		Version:       versionLine(),
		SilenceErrors: true,
		SilenceUsage:  true,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usage("unknown command %q: fleetlearn-edge takes flags, or one of the commands enroll, version and help", args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, procs, level, err := f.config(cmd)
			if err != nil {
				return err
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
			return agent(cmd.Context(), cfg, process{procs: procs, healthAddr: f.healthAddr, trace: f.trace}, log)
		},
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usage("%w\nRun '%s --help' for usage", err, c.CommandPath())
	})

	fl := root.Flags()
	fl.SortFlags = false
	fl.StringVar(&f.cfg.DatasetDir, "dataset", "", "the device's local dataset directory (docs/DATASET.md); required")
	fl.StringVar(&f.cfg.DataDir, "data-dir", "fleetlearn-edge",
		"the directory enrollment wrote (device key, NATS credentials, NATS URL, CA, trusted publishers); also holds the caches")
	fl.StringVar(&f.cfg.NATSURL, "nats-url", "",
		"NATS URL of the aggregator (default: the one enrollment stored in --data-dir, else nats://127.0.0.1:4222)")
	fl.StringVar(&f.cfg.Credentials, "creds", "", "NATS creds file (default: the one enrollment stored in --data-dir)")
	fl.BoolVar(&f.cfg.InsecureNATS, "insecure-nats", false,
		"connect without credentials, to a server run with --insecure-nats (no enrollment)")
	fl.StringVar(&f.pubs, "module-publishers", "", "JWK Set file of trusted module publishers (default: the one enrollment stored)")
	fl.StringVar(&f.cfg.DeviceID, "device-id", "", "pseudonymous device id (default: the one enrollment stored, else one generated once and kept in --data-dir)")
	fl.StringVar(&f.tasks, "tasks", "", "comma-separated task ids to join (default: any)")
	fl.StringVar(&f.cfg.DeviceClass, "device-class", "", "device class reported at check-in")
	fl.BoolVar(&f.cfg.Charging, "charging", true, "report the device as charging")
	fl.BoolVar(&f.cfg.Idle, "idle", true, "report the device as idle")
	fl.BoolVar(&f.cfg.Unmetered, "unmetered", true, "report the network as unmetered")
	fl.StringVar(&f.level, "log-level", "info", "debug, info, warn or error")
	fl.StringVar(&f.healthAddr, "health-addr", "",
		"serve the health checks /healthz (running) and /readyz (connected to NATS) in plain HTTP on `ADDR` (host:port); "+
			"unauthenticated, so keep it on loopback or the pod network")
	f.trace = tracing.Config{ServiceName: "fleetlearn-edge", OTLPFromEnv: true}
	tracing.AddFlags(fl, &f.trace)
	fl.StringVar(&f.cfg.WASMEngine, "wasm-engine", "",
		"how update modules run: auto (interpreted first, compiled once a module's calls have paid for compiling it), "+
			"compiler (compiled before the first call) or interpreter (default: auto where wazero compiles, else interpreter)")
	fl.IntVar(&f.procs, "max-procs", 1, "CPU budget: threads running the agent's Go code and training kernels at once (GOMAXPROCS; 0: one per core, or $GOMAXPROCS)")

	root.AddCommand(newEnrollCommand(), newHealthCommand(), &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit, Go version, platform, WASM engine and module ABI",
		Example: `  fleetlearn-edge version
  fleetlearn-edge --version`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), versionLine())
			return err
		},
	})
	// Known before Execute, so that cliflags.SingleDash rewrites -help and
	// -version too.
	root.InitDefaultHelpFlag()
	root.InitDefaultVersionFlag()
	for _, c := range root.Commands() {
		c.InitDefaultHelpFlag()
	}
	return root
}

// config turns the parsed flags into the agent's configuration, its
// GOMAXPROCS and its log level, reading the files they name.
func (f *flags) config(cmd *cobra.Command) (edge.Config, int, slog.Level, error) {
	cfg := f.cfg
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.level)); err != nil {
		return cfg, 0, 0, usage("--log-level: %v", err)
	}
	if cfg.DatasetDir == "" {
		return cfg, 0, 0, usage("--dataset is required: the device's local dataset directory (docs/DATASET.md)\nRun 'fleetlearn-edge --help' for usage")
	}
	if f.procs < 0 {
		return cfg, 0, 0, usage("--max-procs must be 0 or more")
	}
	procs := f.procs
	// The agent trains one step at a time on single-threaded kernels; more Ps
	// only add scheduler and collector overhead and take the owner's cores.
	if !cmd.Flags().Changed("max-procs") && os.Getenv("GOMAXPROCS") != "" {
		procs = 0 // an explicit environment wins over the default
	}
	if e := cfg.WASMEngine; e != "" && !slices.Contains(wasm.Engines(), e) {
		return cfg, 0, 0, usage("--wasm-engine %q: this machine runs %s", e, strings.Join(wasm.Engines(), ", "))
	}
	if f.tasks != "" {
		cfg.TaskIDs = strings.Split(f.tasks, ",")
	}
	if cfg.NATSURL == "" {
		cfg.NATSURL = edge.SavedNATSURL(cfg.DataDir)
	}
	if cfg.NATSURL == "" {
		cfg.NATSURL = "nats://127.0.0.1:4222"
	}
	if f.pubs != "" {
		b, err := os.ReadFile(f.pubs)
		if err != nil {
			return cfg, 0, 0, fmt.Errorf("--module-publishers: %w", err)
		}
		cfg.ModulePublishers = b
	}
	return cfg, procs, level, nil
}
