package servercmd

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/internal/cliflags"
	"github.com/fleetlearn/fleetlearn/internal/tracing"
	"github.com/fleetlearn/fleetlearn/internal/version"
	"github.com/fleetlearn/fleetlearn/server"
	"github.com/fleetlearn/fleetlearn/wasm"
)

// usage makes an error that is the command line's fault (exit status 2).
func usage(format string, a ...any) error { return cliflags.Usage(format, a...) }

// isUsage reports whether err is the command line's fault.
func isUsage(err error) bool { return cliflags.IsUsage(err) }

// serveFunc runs the aggregator with cfg and opts until ctx ends.
type serveFunc func(ctx context.Context, cfg server.Config, log *slog.Logger, opts ...server.Option) error

// flags are the command line: the server configuration and what becomes it.
type flags struct {
	cfg          server.Config
	level        string
	tlsHosts     string
	publishers   string
	writeNATS    string
	resolverDir  string
	poolTenants  []string
	kubeCapacity string
	trace        tracing.Config
}

// versionLine names the build and the WASM engine its sandbox (server
// evaluation, module checks) runs with.
func versionLine() string {
	return version.Get().String("fleetlearn-server", "wasm "+wasm.Engine(), wasm.ABIRange())
}

const long = `fleetlearn-server is the Fleetlearn aggregator: it runs federated training
rounds for a fleet of devices running fleetlearn-edge. One process holds
  - an embedded NATS server with JetStream, which carries the round protocol,
    models and modules (or a connection to an external cluster, --nats-url);
  - SQLite (tasks, model versions, modules, enrolled devices), the round
    coordinator and the WASM sandbox;
  - the gRPC API, for the fleetlearn CLI and for device enrollment, over TLS
    with bearer tokens;
  - Prometheus /metrics and the health checks /healthz and /readyz (plain
    HTTP) on loopback, and the tamper-evident audit log.

All state lives under --data-dir: fleetlearn.db, audit.db, jetstream/,
wasm-cache/, keys/ (token signing keys), nats-auth/ (the NATS operator and
account keys) and tls/. On first start the server writes there
  tls/ca.crt    the CA of its TLS certificate: the CLI trusts it with --ca or
                $FLEETLEARN_CA, devices with fleetlearn-edge enroll --ca
  admin.token   an admin API token (mode 0600), for the CLI on this host:
                $FLEETLEARN_TOKEN_FILE
Whoever can read the directory can mint any token: keep it private.

By default the API and NATS listen on loopback only. --public-host NAME puts
both on every interface (:7070 and :4222), adds NAME to the certificate and
tells enrolling devices to reach NATS at NAME; devices then enroll with
"fleetlearn-edge enroll --api NAME:7070". NATS admits only enrolled devices,
each limited to its own subjects; --nats-tls encrypts it too. Where devices
reach NATS by another address (a load balancer, NAT, or an external cluster
known inside by a private name), --nats-advertise URL says which. Devices
are never handed 0.0.0.0: listening on every interface needs one of the two.

An external NATS cluster (--nats-url) must trust this server's operator:
include the fragment --write-nats-config writes in every node's
configuration. The server refuses a NATS that admits clients without
credentials (--insecure-nats allows it) and one that refuses its own, and
keeps reports and blobs on min(3, cluster size) replicas (--replicas).

Flags may also be written with one dash (-data-dir DIR), as in earlier
releases. The server stops cleanly on SIGINT or SIGTERM.`

const examples = `  # one machine: the server, the CLI and devices on loopback
  fleetlearn-server --data-dir fleetlearn-data --module-publishers publishers.jwks

  # devices on other hosts enroll with --api aggregator.example.net:7070
  fleetlearn-server --data-dir /var/lib/fleetlearn --public-host aggregator.example.net \
    --nats-tls --module-publishers publishers.jwks

  # the embedded NATS server's monitoring, for nats-top and exporters
  fleetlearn-server --data-dir /var/lib/fleetlearn --nats-monitor 127.0.0.1:8222

  # an external NATS cluster: make it trust this server's operator, then use it
  fleetlearn-server --data-dir /var/lib/fleetlearn --write-nats-config fleetlearn-auth.conf
  fleetlearn-server --data-dir /var/lib/fleetlearn --nats-url nats://nats-1:4222,nats://nats-2:4222,nats://nats-3:4222 \
    --nats-advertise nats://nats.example.net:4222

  # replicas sharing PostgreSQL and a NATS cluster (docs/HA.md): one leads, the others stand by;
  # the secrets are made once and every replica takes the same copy; the password comes from $PGPASSWORD
  fleetlearn-server replica-secrets --data-dir fleetlearn-replica
  fleetlearn-server --data-dir /var/lib/fleetlearn --store postgres://fleetlearn@db.example.net:5432/fleetlearn \
    --nats-url nats://nats-1:4222,nats://nats-2:4222,nats://nats-3:4222 --secrets-from fleetlearn-replica

  # is the server on this host ready? (exit status 0 or 1)
  fleetlearn-server health --addr 127.0.0.1:9464`

// newRootCommand is the fleetlearn-server command; serve runs the server.
// Errors are returned from Execute, not printed; isUsage tells those that
// are the command line's fault.
func newRootCommand(serve serveFunc) *cobra.Command {
	f := &flags{}
	root := &cobra.Command{
		Use:           "fleetlearn-server",
		Short:         "Run the Fleetlearn aggregator: federated rounds, device enrollment and the operator API",
		Long:          long,
		Example:       examples,
		Version:       versionLine(),
		SilenceErrors: true,
		SilenceUsage:  true,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usage("unexpected argument %q: fleetlearn-server takes only flags", args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.writeNATS != "" {
				return f.writeNATSConfig(cmd)
			}
			cfg, level, err := f.config(cmd)
			if err != nil {
				return err
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
			tp, flush, err := tracing.Setup(cmd.Context(), f.trace)
			if err != nil {
				return usage("%v", err)
			}
			defer func() {
				// Spans of the last rounds are written before the process exits.
				ctx, cancel := context.WithTimeout(context.WithoutCancel(cmd.Context()), 10*time.Second)
				defer cancel()
				if err := flush(ctx); err != nil {
					log.Warn("flushing traces", "err", err)
				}
			}()
			return serve(cmd.Context(), cfg, log, server.WithTracerProvider(tp))
		},
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usage("%w\nRun '%s --help' for usage", err, c.CommandPath())
	})

	fl := root.Flags()
	fl.SortFlags = false
	fl.StringVar(&f.cfg.DataDir, "data-dir", "fleetlearn-data", "keep SQLite, JetStream, keys, the TLS CA and caches in `DIR`")
	fl.StringVar(&f.cfg.Store, "store", "", "keep state in the PostgreSQL database at `URL` (postgres://user@host:5432/db), shared by replicas "+
		"of which one leads and the others stand by (docs/HA.md); needs --nats-url. Default: an SQLite file in --data-dir")
	fl.StringVar(&f.cfg.ReplicaName, "replica-name", "", "name this replica in the lease (default: host name and process id)")
	fl.StringVar(&f.cfg.APIAdvertise, "api-advertise", "", "with --store: the `HOST:PORT` at which the other replicas reach this one's gRPC API, "+
		"to which a standby forwards the API calls it receives (default: --grpc-addr, with the host name for every interface)")
	fl.BoolVar(&f.cfg.ShardAggregation, "shard-aggregation", false, "as leader, hand the update reports of plaintext training rounds "+
		"to the aggregation workers (--aggregation-workers, on any replica), which check and sum them; the leader combines their sums "+
		"and reads a report itself when no worker answers (docs/HA.md)")
	fl.IntVar(&f.cfg.AggregationWorkers, "aggregation-workers", 0, "run `N` aggregation workers in this process, leader or standby, "+
		"for leaders with --shard-aggregation (0: none)")
	fl.DurationVar(&f.cfg.LeaseTTL, "lease-ttl", 0, fmt.Sprintf("with --store: how long PostgreSQL keeps the lease of a leader it no longer hears from (default %v)", server.DefaultLeaseTTL))
	fl.StringVar(&f.cfg.SecretsFrom, "secrets-from", "",
		"at start, take the secrets every replica shares (the TLS CA, token keys, admin token, audit keys, and nats-auth/ if there) "+
			"from `DIR`, laid out as in a data directory (fleetlearn-server replica-secrets writes one; a Secret volume), into --data-dir")
	fl.StringVar(&f.cfg.PublicHost, "public-host", "",
		"the DNS name or IP address (`HOST`) by which devices and operators elsewhere reach this server: serves the API and NATS "+
			"on every interface, puts HOST in the TLS certificate and in the NATS URL enrollment gives devices")
	fl.StringVar(&f.cfg.GRPCAddr, "grpc-addr", "127.0.0.1:7070", "serve the gRPC API on `ADDR`; with --public-host, :7070 (every interface) unless given")
	fl.StringVar(&f.cfg.NATSURL, "nats-url", "", "use the external NATS cluster at `URL` (comma-separated for several servers) instead of the embedded server")
	fl.StringVar(&f.cfg.NATSListen, "nats-listen", "127.0.0.1:4222", "embedded NATS client address `ADDR`; with --public-host, 0.0.0.0:4222 unless given")
	fl.BoolVar(&f.cfg.NATSTLS, "nats-tls", false, "serve the embedded NATS server over TLS with the server's CA")
	fl.StringVar(&f.cfg.NATSAdvertise, "nats-advertise", "",
		"give enrolling devices the NATS `URL` (comma-separated for several) instead of the one derived from --public-host or --nats-url: "+
			"for a load balancer, NAT or a cluster-internal --nats-url")
	fl.StringVar(&f.cfg.NATSAuthFrom, "nats-auth-from", "",
		"at start, take the NATS operator and account keys from `DIR` (the nats-auth directory --write-nats-config leaves, "+
			"or a Secret volume holding it) into --data-dir")
	fl.StringVar(&f.cfg.NATSMonitor, "nats-monitor", "",
		"serve the embedded NATS server's HTTP monitoring (/varz, /jsz, /connz …) on `ADDR` (host:port); unauthenticated: keep it on loopback")
	fl.StringVar(&f.cfg.MetricsAddr, "metrics-addr", "127.0.0.1:9464",
		"serve Prometheus /metrics and the health checks /healthz and /readyz, in plain HTTP, on `ADDR`, or \"off\"")
	fl.StringVar(&f.cfg.UIAddr, "ui", "",
		"serve the web dashboard on `ADDR` (host:port), over TLS with the server's certificate; viewers sign in with API tokens "+
			"(fleetlearn token mint) and see what their roles allow; off unless given")
	fl.BoolVar(&f.cfg.UIInsecure, "ui-insecure", false, "serve the dashboard over plain HTTP: only with a loopback --ui address")
	fl.StringVar(&f.tlsHosts, "tls-hosts", "", "extra comma-separated DNS names or IPs (`HOSTS`) for the server certificate")
	fl.BoolVar(&f.cfg.GRPCInsecure, "grpc-insecure", false, "serve the gRPC API without TLS (local experiments only)")
	fl.BoolVar(&f.cfg.InsecureNATS, "insecure-nats", false,
		"run NATS without authorization: any client may use any subject, devices need no enrollment; "+
			"needed to use an external NATS that admits clients without credentials")
	fl.StringVar(&f.cfg.Fleet, "fleet", server.DefaultFleet, "the `NAME` of the fleet that devices enroll into")
	fl.StringVar(&f.publishers, "module-publishers", "", "trust the module publisher keys in the JWK Set `FILE` (fleetlearn module publisher-jwks)")
	fl.DurationVar(&f.cfg.PaceWindow, "pace-window", 2*time.Second, "spread of the check-ins of devices not selected")
	fl.Int64Var(&f.cfg.MemoryHeadroom, "memory-headroom", 0,
		"`bytes` of garbage the server's heap may hold beyond its models and round sums before Go collects it; 0 is 128 MiB, -1 leaves GOGC/GOMEMLIMIT alone")
	fl.Int64Var(&f.cfg.ReportStoreBytes, "report-store-bytes", 0,
		"most `bytes` the reports stream keeps; 0 is 8 GiB (or half the embedded JetStream's storage if less), -1 no limit")
	fl.IntVar(&f.cfg.Replicas, "replicas", 0,
		"JetStream replicas `N` of reports and blobs on an external cluster; 0 follows the cluster (3 on a cluster of 3 or more)")
	fl.StringVar(&f.cfg.AuditOrigin, "audit-origin", audit.DefaultOrigin,
		"the `NAME` of the audit log, first line of its checkpoints (e.g. \"fleetlearn.example.com/audit\")")
	fl.StringArrayVar(&f.cfg.AuditWitnesses, "audit-witness", nil,
		"accept and serve the cosignatures of audit checkpoints by the witness with verifier `KEY` (fleetlearn audit witness init prints it); repeatable")
	fl.StringArrayVar(&f.poolTenants, "pool-tenant", nil, poolTenantHelp)
	fl.DurationVar(&f.cfg.PoolHeartbeat, "pool-heartbeat", 0,
		"pool workers' heartbeat interval `DUR` (0: 2s); a worker silent for three of them is lost and its jobs restart from their checkpoints")
	fl.IntVar(&f.cfg.PoolMaxWorkersPerToken, "pool-max-workers-per-token", 0,
		"live pool workers `N` one pool-worker token may register (0: 4; tokens are minted one per machine)")
	fl.StringVar(&f.cfg.CarbonForecast, "carbon-forecast", "",
		"carbon intensity forecast `FILE` (Carbon Aware SDK or WattTime JSON), or a provider URL answering in one of them "+
			"(https; a bearer token from $FLEETLEARN_CARBON_TOKEN), read at each submission of a pool job with carbon placement")
	fl.StringVar(&f.cfg.PoolKube.Cluster, "pool-kubernetes", "",
		"run pool jobs that ask for the Kubernetes executor on a cluster: \"in-cluster\" (this pod's service account) or a kubeconfig `FILE`")
	fl.StringVar(&f.cfg.PoolKube.Namespace, "pool-kube-namespace", "", "with --pool-kubernetes: the `NAMESPACE` of the JobSets and the tenants' LocalQueues (default "+server.DefaultPoolKubeNamespace+")")
	fl.StringVar(&f.cfg.PoolKube.Image, "pool-kube-image", "", "with --pool-kubernetes: the container `IMAGE` every rank runs; a job's command is its argv")
	fl.StringVar(&f.cfg.PoolKube.CheckpointClaim, "pool-kube-checkpoint-claim", "", "with --pool-kubernetes: the ReadWriteMany PersistentVolumeClaim `NAME` the ranks keep checkpoints on")
	fl.StringVar(&f.cfg.PoolKube.CheckpointDir, "pool-kube-checkpoint-dir", "",
		"with --pool-kubernetes: where this server mounts that claim (`DIR`), to follow the jobs' checkpoints and store their models; empty: jobs end without a stored model")
	fl.StringVar(&f.cfg.PoolKube.ServiceAccount, "pool-kube-service-account", "", "with --pool-kubernetes: the service account `NAME` of the ranks' pods")
	fl.Int32SliceVar(&f.cfg.PoolKube.RetryableExitCodes, "pool-kube-retryable-exit-codes", nil,
		"with --pool-kubernetes: exit `CODES` of a rank after which the whole gang restarts (up to the job's max restarts); other non-zero exits fail the job")
	fl.StringVar(&f.kubeCapacity, "pool-kube-capacity", "",
		"with --pool-kubernetes: the cluster's share for the pool, `cpu=CORES,memory=BYTES,gpus=N`; the server then creates and updates Kueue's flavors and the tenants' queues (otherwise apply deploy/kubernetes/pool/queues.yaml)")
	fl.StringVar(&f.level, "log-level", "info", "log at `LEVEL`: debug, info, warn or error")
	f.trace = tracing.Config{ServiceName: "fleetlearn-server", OTLPFromEnv: true}
	tracing.AddFlags(fl, &f.trace)
	fl.StringVar(&f.writeNATS, "write-nats-config", "",
		"write the nats-server.conf fragment that makes an external NATS cluster trust this server's operator to `FILE` (\"-\": standard output), and exit")
	fl.StringVar(&f.resolverDir, "nats-resolver-dir", "/var/lib/nats/jwt", "with --write-nats-config: the resolver's JWT directory `DIR` on the NATS servers")

	root.AddCommand(&cobra.Command{
		Use:   "version",
		Short: "Print the version, commit, Go version, platform, WASM engine and module ABI",
		Example: `  fleetlearn-server version
  fleetlearn-server --version`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), versionLine())
			return err
		},
	})
	root.AddCommand(newHealthCommand(), newCACommand(), newReplicaSecretsCommand())
	// Known before Execute, so that cliflags.SingleDash rewrites -help and
	// -version too.
	root.InitDefaultHelpFlag()
	root.InitDefaultVersionFlag()
	return root
}

// config turns the parsed flags into the server configuration and log
// level, reading the files they name. Listen addresses left at their
// defaults are left to the server when --public-host is given, which then
// opens them on every interface.
func (f *flags) config(cmd *cobra.Command) (server.Config, slog.Level, error) {
	cfg := f.cfg
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.level)); err != nil {
		return cfg, 0, usage("--log-level: %v", err)
	}
	if cfg.NATSMonitor != "" && cfg.NATSURL != "" {
		return cfg, 0, usage("--nats-monitor serves the embedded NATS server's monitoring and cannot be used with --nats-url: " +
			"enable http_port in the external cluster's own configuration")
	}
	if cfg.AggregationWorkers < 0 || cfg.AggregationWorkers > 256 {
		return cfg, 0, usage("--aggregation-workers %d: give 0 to 256 (a worker per core is plenty)", cfg.AggregationWorkers)
	}
	if cfg.Store == "" {
		// A unit or manifest whose store variable came out empty must not
		// start a replica on an SQLite file of its own.
		for _, name := range []string{"replica-name", "lease-ttl", "api-advertise"} {
			if cmd.Flags().Changed(name) {
				return cfg, 0, usage("--%s is for replicas sharing a PostgreSQL store: give --store postgres://user@host:5432/db "+
					"(empty here), or drop --%s", name, name)
			}
		}
	}
	if cfg.PublicHost != "" {
		if !cmd.Flags().Changed("grpc-addr") {
			cfg.GRPCAddr = ""
		}
		if !cmd.Flags().Changed("nats-listen") {
			cfg.NATSListen = ""
		}
	}
	if f.tlsHosts != "" {
		cfg.TLSHosts = strings.Split(f.tlsHosts, ",")
	}
	if f.publishers != "" {
		b, err := os.ReadFile(f.publishers)
		if err != nil {
			return cfg, 0, usage("--module-publishers: %v", err)
		}
		cfg.ModulePublishersJWKS = b
	}
	tenants, err := parsePoolTenants(f.poolTenants)
	if err != nil {
		return cfg, 0, err
	}
	cfg.PoolTenants = tenants
	if cfg.PoolKube.Capacity, err = parseCapacity(f.kubeCapacity); err != nil {
		return cfg, 0, usage("%v", err)
	}
	if cfg.PoolKube.Cluster == "" && (f.kubeCapacity != "" || len(cfg.PoolKube.RetryableExitCodes) > 0 || cfg.PoolKube.Namespace != "" || cfg.PoolKube.Image != "" || cfg.PoolKube.CheckpointClaim != "" || cfg.PoolKube.CheckpointDir != "") {
		return cfg, 0, usage("--pool-kube-* flags need --pool-kubernetes in-cluster|KUBECONFIG")
	}
	if cfg.PoolHeartbeat != 0 && (cfg.PoolHeartbeat < 10*time.Millisecond || cfg.PoolHeartbeat > time.Hour) {
		return cfg, 0, usage("--pool-heartbeat %s: want a duration between 10ms and 1h", cfg.PoolHeartbeat)
	}
	if cfg.PoolMaxWorkersPerToken < 0 {
		return cfg, 0, usage("--pool-max-workers-per-token %d: want a positive count (0: the default, 4)", cfg.PoolMaxWorkersPerToken)
	}
	return cfg, level, nil
}

// writeNATSConfig writes the external cluster's configuration fragment and
// says what to do with it; "-" writes it to standard output alone, for a
// pipe or kubectl create secret.
func (f *flags) writeNATSConfig(cmd *cobra.Command) error {
	if f.writeNATS == "-" {
		conf, err := server.NATSResolverConfig(cmd.Context(), f.cfg.DataDir, f.resolverDir)
		if err != nil {
			return fmt.Errorf("--write-nats-config: %w", err)
		}
		_, err = cmd.OutOrStdout().Write(conf)
		return err
	}
	if err := server.WriteNATSResolverConfig(cmd.Context(), f.cfg.DataDir, f.resolverDir, f.writeNATS); err != nil {
		return fmt.Errorf("--write-nats-config: %w", err)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: include it in each NATS server's configuration (include ./%s), make %s writable by nats-server, "+
		"then run the aggregator with --nats-url and --data-dir %s (or --nats-auth-from %s)\n",
		f.writeNATS, filepath.Base(f.writeNATS), f.resolverDir, f.cfg.DataDir, filepath.Join(f.cfg.DataDir, server.NATSAuthDir))
	return nil
}
