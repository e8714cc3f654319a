package workercmd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/fleetlearn/fleetlearn/client"
	"github.com/fleetlearn/fleetlearn/internal/bytesize"
	"github.com/fleetlearn/fleetlearn/internal/cliflags"
	"github.com/fleetlearn/fleetlearn/internal/version"
	"github.com/fleetlearn/fleetlearn/worker"
)

func usage(format string, a ...any) error { return cliflags.Usage(format, a...) }

func versionLine() string { return version.Get().String("fleetlearn-worker") }

const long = `fleetlearn-worker is the Fleetlearn pool agent. It registers this machine
with a pool server (fleetlearn-server's PoolWorkerService), offering its
CPUs, memory and GPUs, found out within this process's cgroup limits unless
--cpus and --memory say otherwise, and runs the job ranks the server leases
it: the built-in MLP trainer or a job's own command, one child process per
rank, metered for CPU-seconds, peak memory and energy. Checkpoints of
built-in trainer ranks are kept on the server; a rank stopped or lost
resumes from its job's last committed checkpoint.

The agent needs a pool-worker token, minted on the server host:
  fleetlearn token mint --data-dir SERVER_DIR --subject NAME --role pool-worker > token

Ranks die with the agent. Exit status: 0 stopped by SIGINT or SIGTERM; 1
failed; 2 command-line error; 3 the server refused the token, so restarting
will not help.`

const runExamples = `  # join a pool with the server's CA certificate and a pool-worker token
  fleetlearn-worker run --server pool.example.net:7070 --ca ca.crt --token-file token \
    --work-dir /var/lib/fleetlearn-worker

  # offer 8 cores and 32 GiB only, with data directories for "dir:NAME" datasets
  fleetlearn-worker run --server 10.0.0.5:7070 --ca ca.crt --token-file token --work-dir W \
    --data-root /srv/datasets --cpus 8 --memory 34359738368`

const rootExamples = `  # on the server host: a token for this machine
  fleetlearn token mint --data-dir SERVER_DIR --subject gpu-7 --role pool-worker > token

  # on this machine
  fleetlearn-worker run --server pool.example.net:7070 --ca ca.crt --token-file token --work-dir /var/lib/fleetlearn-worker`

// newRootCommand is the fleetlearn-worker command; rankDone receives the
// hidden rank command's outcome.
func newRootCommand(rankDone func(error)) *cobra.Command {
	root := &cobra.Command{
		Use:           "fleetlearn-worker",
		Short:         "Run the Fleetlearn pool agent: lend this machine to a pretraining pool",
		Long:          long,
		Example:       rootExamples,
		Version:       versionLine(),
		SilenceErrors: true,
		SilenceUsage:  true,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usage("unknown command %q: fleetlearn-worker has the commands run, version and help", args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usage("say what to do: 'fleetlearn-worker run --server HOST:7070 --ca FILE --token-file FILE --work-dir DIR' (see --help)")
		},
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usage("%w\nRun '%s --help' for usage", err, c.CommandPath())
	})
	root.AddCommand(newRunCommand(), newRankCommand(rankDone), &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit and Go version",
		Example: `  fleetlearn-worker version
  fleetlearn-worker --version`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), versionLine())
			return err
		},
	})
	root.InitDefaultHelpFlag()
	root.InitDefaultVersionFlag()
	for _, c := range root.Commands() {
		c.SetFlagErrorFunc(root.FlagErrorFunc())
	}
	return root
}

func newRunCommand() *cobra.Command {
	var cfg worker.Config
	var ca, tokenFile, level string
	var cpus float64
	cmd := &cobra.Command{
		Use:     "run --server HOST:PORT --ca FILE --token-file FILE --work-dir DIR [flags]",
		Short:   "Register with a pool server and run the ranks it leases, until SIGINT or SIGTERM",
		Long:    long,
		Example: runExamples,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case cfg.Server == "":
				return usage("run: --server is required: the pool server's gRPC address, HOST:7070")
			case tokenFile == "":
				return usage("run: --token-file is required: mint a token on the server host with\n  fleetlearn token mint --data-dir SERVER_DIR --subject %s --role pool-worker > token", subject())
			case ca == "" && !cfg.Insecure:
				return usage("run: --ca is required: the server's <data-dir>/tls/ca.crt, copied to this machine (or --insecure for a server run with --grpc-insecure)")
			case ca != "" && cfg.Insecure:
				return usage("run: --ca and --insecure together: choose one")
			case cfg.WorkDir == "":
				return usage("run: --work-dir is required: a directory for the ranks' working and checkpoint directories")
			case cpus < 0 || cfg.Capacity.MemoryBytes < 0:
				return usage("run: --cpus and --memory must not be negative")
			}
			cfg.Capacity.MilliCPU = int64(cpus * 1000)
			tok, err := client.ReadToken(tokenFile)
			if err != nil {
				return fmt.Errorf("run: --token-file: %w", err)
			}
			cfg.Token = tok
			if ca != "" {
				if cfg.CAPEM, err = os.ReadFile(ca); err != nil {
					return fmt.Errorf("run: --ca: %w", err)
				}
			}
			var lv slog.Level
			if err := lv.UnmarshalText([]byte(level)); err != nil {
				return usage("run: --log-level %q: want debug, info, warn or error", level)
			}
			cfg.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: lv}))
			a, err := worker.New(cfg)
			if err != nil {
				return err
			}
			err = a.Run(cmd.Context())
			if errors.Is(err, context.Canceled) && cmd.Context().Err() != nil {
				return nil
			}
			return err
		},
	}
	fl := cmd.Flags()
	fl.SortFlags = false
	fl.StringVar(&cfg.Server, "server", "", "the pool server's gRPC address, HOST:PORT (the server's --grpc-addr; port 7070 by default)")
	fl.StringVar(&ca, "ca", "", "the server's CA certificate (PEM): its <data-dir>/tls/ca.crt")
	fl.StringVar(&tokenFile, "token-file", "", "file holding a pool-worker token from 'fleetlearn token mint --role pool-worker'")
	fl.StringVar(&cfg.WorkDir, "work-dir", "", "directory for the ranks' lease files, working directories and checkpoints")
	fl.StringVar(&cfg.DataRoot, "data-root", "", `directory whose subdirectories (data.WriteDir format) jobs name as "dir:NAME" datasets`)
	fl.StringVar(&cfg.Name, "name", "", "name shown to operators (default: the host name)")
	fl.StringVar(&cfg.Zone, "zone", "", "grid region or cloud location this machine runs in, as the server's carbon forecast names it (e.g. westus)")
	fl.Float64Var(&cpus, "cpus", 0, "CPUs to offer, fractions allowed (default: detected)")
	fl.Var((*bytesize.Value)(&cfg.Capacity.MemoryBytes), "memory", "memory to offer, such as 8GiB or a byte count (default: detected)")
	fl.BoolVar(&cfg.Insecure, "insecure", false, "connect without TLS, to a server run with --grpc-insecure (the token crosses the network in the clear)")
	fl.StringVar(&level, "log-level", "info", "debug, info, warn or error")
	return cmd
}

// newRankCommand is the hidden command the agent runs for a built-in
// trainer rank.
func newRankCommand(done func(error)) *cobra.Command {
	var lease string
	cmd := &cobra.Command{
		Use:    "rank --lease FILE",
		Short:  "Run one built-in trainer rank (started by the agent)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if lease == "" {
				return usage("rank: --lease is required; this command is run by 'fleetlearn-worker run', not by hand")
			}
			done(worker.RunRank(cmd.Context(), lease))
			return nil
		},
	}
	cmd.Flags().StringVar(&lease, "lease", "", "the lease file the agent wrote (read and removed)")
	return cmd
}

func subject() string {
	h, err := os.Hostname()
	if err != nil || h == "" || strings.ContainsAny(h, " '\"") {
		return "NAME"
	}
	return h
}
