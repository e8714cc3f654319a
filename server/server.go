// Package server is Fleetlearn's cloud aggregator service: an embedded (or
// external) NATS with JetStream for the round protocol and blobs, SQLite for
// durable state, the round coordinator, a gRPC API and Prometheus metrics.
//
//	s, err := server.New(server.Config{DataDir: dir})
//	err = s.Start(ctx)
//	defer s.Shutdown(ctx)
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/internal/clock"
	"github.com/fleetlearn/fleetlearn/internal/handoff"
	"github.com/fleetlearn/fleetlearn/internal/healthcheck"
	"github.com/fleetlearn/fleetlearn/internal/memlimit"
	"github.com/fleetlearn/fleetlearn/pool"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/server/internal/blobs"
	"github.com/fleetlearn/fleetlearn/server/internal/coord"
	"github.com/fleetlearn/fleetlearn/server/internal/metrics"
	"github.com/fleetlearn/fleetlearn/server/internal/natsembed"
	"github.com/fleetlearn/fleetlearn/server/internal/natsx"
	"github.com/fleetlearn/fleetlearn/server/internal/poolsvc"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
	"github.com/fleetlearn/fleetlearn/wasm"
)

// Config says where the service keeps state and listens. Zero values take the
// defaults noted.
type Config struct {
	DataDir string // required: SQLite, JetStream store and the WASM compilation cache live here
	// Store is a PostgreSQL URL (postgres://user@host:5432/db) for
	// aggregators that share their state and take over from each other
	// (docs/HA.md): one at a time, the holder of the lease LeaseName, runs
	// the rounds and serves the API; the others wait as standbys. Empty
	// keeps state in an SQLite file in DataDir (StoreFile), for one
	// aggregator. A PostgreSQL store needs an external NATS cluster
	// (NATSURL).
	Store string
	// ReplicaName is how this aggregator names itself in the lease
	// (default: host name and process id).
	ReplicaName string
	// LeaseTTL is how long the database keeps the lease of a leader it no
	// longer hears from (default DefaultLeaseTTL); a leader renews every
	// quarter of it.
	LeaseTTL time.Duration
	// APIAdvertise is the "host:port" at which the other replicas reach
	// this one's gRPC API: a standby forwards the API calls it receives to
	// the leader's. Default: GRPCAddr as bound, its host replaced by the
	// host name when it listens on every interface.
	// The server certificate covers its host.
	APIAdvertise string
	// ShardAggregation hands the update reports of plaintext training
	// rounds to the aggregation workers in the NATS queue group, which
	// read, check and sum them; the leader combines their partial sums
	// (docs/HA.md, "Sharded aggregation"). AggregationWorkers is how many
	// workers this replica, leader or standby, runs (0: none).
	ShardAggregation   bool
	AggregationWorkers int
	NATSURL            string // external NATS cluster; empty starts an embedded server
	NATSListen         string // embedded server's client address (default 127.0.0.1:4222, all interfaces with PublicHost; port 0 picks one)
	GRPCAddr           string // default 127.0.0.1:7070, all interfaces with PublicHost; port 0 picks one
	MetricsAddr        string // Prometheus /metrics, /healthz and /readyz (plain HTTP); default 127.0.0.1:9464; "off" disables
	// MaxMessageBytes is the embedded server's max_payload and the reports
	// stream's message size limit (default wire.MaxMessageBytes).
	MaxMessageBytes int32
	// ReportStoreBytes is the most the reports stream keeps on disk; once
	// full it refuses reports until rounds close (devices retry). Default 0:
	// DefaultReportStoreBytes, or half of what the embedded server's
	// JetStream may store if that is less; -1: no limit. One device can
	// never fill it: each may keep only its largest report per round.
	ReportStoreBytes int64
	// MemoryHeadroom is the garbage the server lets its heap hold beyond
	// its tasks' models, optimizer state and round sums before it collects
	// (internal/memlimit): its memory is those plus about this, whatever
	// the model size. Default 0: DefaultMemoryHeadroom; -1 leaves Go's
	// collector as it is (GOGC, GOMEMLIMIT).
	MemoryHeadroom int64
	// PaceWindow spreads check-ins of devices not selected (default 2s).
	PaceWindow time.Duration
	// CacheDir keeps compiled WASM modules (default DataDir/wasm-cache).
	CacheDir string
	// Replicas of the reports stream and blob bucket on an external cluster
	// (default 0: follow the cluster, min(MaxReplicas, its JetStream
	// servers); the embedded server always uses 1). Checked at every start.
	Replicas int
	// AuditOrigin names the audit log in DataDir, the first line of its
	// checkpoints (default audit.DefaultOrigin); a schema-less URL naming
	// the deployment, such as "fleetlearn.example.com/audit". An existing
	// log keeps the origin it was created with.
	AuditOrigin string
	// AuditWitnesses are the verifier keys of the witnesses whose
	// cosignatures of the audit log's checkpoints the server accepts
	// (AuditService.AddCosignature) and serves with them (GetCheckpoint):
	// "<name>+<hex key id>+<base64 of 0x04 and the Ed25519 public key>", as
	// fleetlearn audit witness init prints them. Empty accepts none.
	AuditWitnesses []string

	// Fleet is the fleet devices enroll into (default DefaultFleet).
	Fleet string
	// InsecureNATS runs NATS without authorization: any client may use any
	// subject and devices need no enrollment. By default the server runs NATS
	// in operator mode (decentralized JWT auth): it connects as its own
	// service user, enrolled devices get user JWTs limited to their own
	// subjects, and only enrolled devices are selected. An external cluster
	// must trust the operator in DataDir/nats-auth (docs/SECURITY.md).
	InsecureNATS bool
	// NATSTLS serves the embedded NATS server's clients over TLS with the
	// server's own CA (the one that signs the gRPC certificate); enrolled
	// agents get the CA with their credentials.
	NATSTLS bool
	// GRPCInsecure serves the gRPC API without TLS, for local experiments
	// only; bearer tokens are still required.
	GRPCInsecure bool
	// TLSHosts are extra DNS names or IP addresses the server certificate
	// covers, besides loopback and the listen hosts.
	TLSHosts []string
	// ModulePublishersJWKS is the JWK Set (identity.PublicJWKS) of the
	// publisher keys whose module signatures RegisterModule accepts; empty
	// refuses every module.
	ModulePublishersJWKS []byte
	// PublicHost is the DNS name or IP address (no port) by which devices
	// and operators on other hosts reach the server. It opens the service
	// beyond loopback: GRPCAddr and NATSListen default to every interface
	// (both are authenticated: TLS and bearer tokens, NATS user JWTs), the
	// server certificate covers it, and enrollment gives devices the
	// embedded NATS server's URL with it as the host (with NATSURL, that
	// URL). Empty keeps the defaults on loopback; metrics stay on loopback
	// either way.
	PublicHost string
	// NATSAdvertise is the NATS URL, or comma-separated URLs, that
	// enrollment gives devices, for when the address the server reaches
	// NATS by is not one devices can dial: a cluster-internal name, a
	// load balancer or NAT in front. Default: NATSURL with an external
	// cluster; the embedded server's address with PublicHost as its host
	// when listening on every interface. An unspecified host (0.0.0.0, ::)
	// is refused.
	NATSAdvertise string
	// NATSAuthFrom names a directory holding the NATS authority's keys (as
	// --write-nats-config leaves them in DataDir/nats-auth), for instance a
	// mounted Kubernetes Secret: at start, missing keys are copied into
	// DataDir/nats-auth and present ones must match.
	NATSAuthFrom string
	// SecretsFrom names a copy of the secrets every replica shares
	// (ReplicaSecrets), laid out as in a data directory (tls/ca.crt,
	// keys/api.key, admin.token, audit.keys, …): a mounted Kubernetes
	// Secret, or what WriteReplicaSecrets or the first replica wrote. At
	// start, files missing in DataDir are copied there and present ones
	// must match; the admin token, which a replica renews itself, is
	// replaced by the copy's. A nats-auth directory in it is taken as with
	// NATSAuthFrom.
	SecretsFrom string
	// NATSMonitor is the "host:port" on which the embedded NATS server
	// serves its HTTP monitoring endpoints (/varz, /jsz, /connz …), for the
	// nats CLI and exporters; empty serves none. They are unauthenticated
	// and show connections (device ids, addresses): keep them on loopback
	// or behind a firewall. An external cluster (NATSURL) serves its own.
	NATSMonitor string

	// PoolTenants are the compute pool's tenants: fair-share weight, quota
	// and budget (default: one tenant "default" of weight 1, uncapped).
	PoolTenants map[string]pool.Tenant
	// PoolHeartbeat is how long a pool worker's heartbeat long poll waits
	// (default 2 s); a worker silent for PoolHeartbeatsToLoss (default 3)
	// of them is lost and its jobs restart from their checkpoints.
	PoolHeartbeat        time.Duration
	PoolHeartbeatsToLoss int
	// PoolMaxWorkersPerToken caps the live pool workers one pool-worker
	// token registers (default 4: tokens are minted one per machine).
	PoolMaxWorkersPerToken int
	// CarbonForecast is a carbon intensity forecast file (Carbon Aware SDK
	// or WattTime layout, pool/carbon), or a provider URL answering in one
	// of them (https, or http on loopback; bearer token from
	// $FLEETLEARN_CARBON_TOKEN), read at each submission of a carbon-aware
	// pool job; empty refuses such jobs.
	CarbonForecast string
	// PoolKube runs pool jobs that ask for the Kubernetes executor.
	PoolKube PoolKube

	// UIAddr is where the web dashboard listens ("host:port"); empty
	// serves none. It is served over TLS with the server's certificate and
	// signs viewers in with API tokens; their roles decide what it shows.
	UIAddr string
	// UIInsecure serves the dashboard over plain HTTP, only on a loopback
	// UIAddr.
	UIInsecure bool
}

// DefaultMemoryHeadroom is the default MemoryHeadroom.
const DefaultMemoryHeadroom = 128 << 20

// DefaultReportStoreBytes is the default ReportStoreBytes.
const DefaultReportStoreBytes = 8 << 30

// DefaultPoolKubeNamespace holds the pool's JobSets and queues unless
// PoolKube.Namespace says otherwise.
const DefaultPoolKubeNamespace = "fleetlearn-pool"

// PoolKube is the Kubernetes executor of the compute pool: command jobs
// become JobSets that Kueue admits from their tenant's LocalQueue.
type PoolKube struct {
	// Cluster is "in-cluster" (the server's pod's service account) or a
	// kubeconfig file; empty runs no Kubernetes executor.
	Cluster string
	// Namespace of the JobSets and LocalQueues (empty:
	// DefaultPoolKubeNamespace); Image every rank runs.
	Namespace, Image string
	// CheckpointClaim is the ReadWriteMany PersistentVolumeClaim of the
	// ranks' checkpoints; CheckpointDir is where the server mounts it, to
	// follow the jobs' progress and store their models (empty: it does not).
	CheckpointClaim, CheckpointDir string
	// ServiceAccount runs the ranks' pods; empty is the namespace's default.
	ServiceAccount string
	// RetryableExitCodes restart the whole gang (up to max_restarts); any
	// other non-zero exit fails the job. Node loss and eviction restart it.
	RetryableExitCodes []int32
	// Capacity, when set, makes the server create and update Kueue's
	// flavors and the tenants' queues (a tenant without a quota gets the
	// whole capacity); zero leaves the queues to the operator
	// (deploy/kubernetes/pool/queues.yaml).
	Capacity pool.Resources
}

// Option injects a collaborator.
type Option func(*options)

type options struct {
	log    *slog.Logger
	clock  clock.Clock
	now    func() time.Time // clock.Now
	rand   *rand.Rand
	tracer trace.TracerProvider
}

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// WithClock sets the clock that decides round deadlines and stamps times
// (default: the system clock).
func WithClock(c clock.Clock) Option { return func(o *options) { o.clock = c } }

// WithRand sets the randomness used for round seeds and pacing jitter.
func WithRand(r *rand.Rand) Option { return func(o *options) { o.rand = r } }

// WithTracerProvider records each federated round as an OpenTelemetry trace
// (docs/TRACING.md); by default nothing is recorded.
func WithTracerProvider(tp trace.TracerProvider) Option { return func(o *options) { o.tracer = tp } }

// Server is the aggregator service.
type Server struct {
	cfg Config
	o   options

	embedded *natsx.Embedded
	nc       *nats.Conn
	// shardWorkers are this replica's aggregation workers, on shardNC
	// (a replica's) or nc (a single server's).
	shardWorkers *coord.ShardWorkers
	shardNC      *nats.Conn
	// natsAuthority runs NATS authorization; nil with Config.InsecureNATS.
	natsAuthority *natsAuthority
	store         *store.Store
	sandbox       *wasm.Sandbox
	coord         *coord.Coordinator
	pool          *poolsvc.Service
	grpc          *grpc.Server
	grpcLn        net.Listener
	// A replica's gRPC socket passes from the standby's forwarding API
	// (standbyAPI) to its own (grpc) once it leads.
	grpcHandoff *handoff.Listener
	standbyAPI  *grpc.Server
	forward     *forwarder
	http        *http.Server
	httpLn      net.Listener
	uiLn        net.Listener // the dashboard's, taken first by listenFirst
	ui          *dashboard
	natsURL     string

	audit       *audit.Log
	auditCancel context.CancelFunc // called by Shutdown to stop the checkpoint ticker
	auditDone   chan struct{}      // closed when the ticker has stopped
	published   []byte             // the last checkpoint note published

	security // TLS, token keys, module publishers, the NATS device authority

	// Replicated (PostgreSQL) only: the lease this replica leads by, its
	// renewals, and what a standby reports while it waits.
	leadership *store.Leadership
	leaseStop  chan struct{}
	leaseDone  chan struct{}
	standby    atomic.Pointer[standby]
	lost       chan error
	deposed    atomic.Bool // the lease was lost
	runMu      sync.Mutex  // guards coord and pool as they are set, against a lost lease
	started    atomic.Bool // Start finished: /readyz may answer 200

	idMu     sync.Mutex // guards ids
	ids      *rand.Rand // task ids; split from o.rand so the coordinator owns that one
	shutdown sync.Once
	closing  atomic.Bool // Shutdown began: /readyz answers 503
	err      error
}

// New validates the configuration; Start brings the service up.
func New(cfg Config, opts ...Option) (*Server, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("server: DataDir is required")
	}
	if err := checkPublicConfig(&cfg); err != nil {
		return nil, err
	}
	if cfg.NATSListen == "" {
		cfg.NATSListen = "127.0.0.1:4222"
		if cfg.PublicHost != "" {
			cfg.NATSListen = anyHost(cfg.PublicHost) + ":4222"
		}
	}
	if err := checkAdvertise(cfg); err != nil {
		return nil, err
	}
	if cfg.GRPCAddr == "" {
		cfg.GRPCAddr = "127.0.0.1:7070"
		if cfg.PublicHost != "" {
			cfg.GRPCAddr = ":7070" // every interface, IPv4 and IPv6
		}
	}
	if cfg.MetricsAddr == "" {
		cfg.MetricsAddr = "127.0.0.1:9464"
	}
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = wire.MaxMessageBytes
	}
	if cfg.AuditOrigin == "" {
		cfg.AuditOrigin = audit.DefaultOrigin
	}
	if err := checkSecurityConfig(&cfg); err != nil {
		return nil, err
	}
	if err := checkUIConfig(cfg); err != nil {
		return nil, err
	}
	if err := checkStoreConfig(&cfg); err != nil {
		return nil, err
	}
	o := options{log: slog.New(slog.DiscardHandler)}
	for _, opt := range opts {
		opt(&o)
	}
	o.clock = clock.Or(o.clock)
	o.now = o.clock.Now
	if o.rand == nil {
		o.rand = rand.New(rand.NewChaCha8(seedFromOS()))
	}
	ids := rand.New(rand.NewPCG(o.rand.Uint64(), o.rand.Uint64()))
	return &Server{cfg: cfg, o: o, ids: ids, lost: make(chan error, 1)}, nil
}

// Start opens state, connects NATS and begins serving. On error everything
// started so far is shut down. A replica that stands by (Config.Store)
// returns only once it leads or ctx ends: to stop it, cancel ctx and wait
// for Start to return before calling Shutdown, which must not run
// concurrently with Start.
func (s *Server) Start(ctx context.Context) (err error) {
	defer func() {
		if err != nil {
			s.Shutdown(context.WithoutCancel(ctx))
			// A failed start serves nothing: it has no addresses.
			s.grpcLn, s.httpLn, s.uiLn = nil, nil, nil
		}
	}()
	if err := s.listenFirst(); err != nil {
		return err
	}
	if err := os.MkdirAll(s.cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("server: data dir: %w", err)
	}
	if err := s.clearImports(); err != nil {
		return err
	}
	// Before anything loads or creates keys: a replica must not make its
	// own.
	if s.cfg.SecretsFrom != "" {
		if err := importReplicaSecrets(s.cfg.SecretsFrom, s.cfg.DataDir); err != nil {
			return err
		}
	}
	if !s.cfg.replicated() {
		if err := s.openAudit(ctx); err != nil {
			return err
		}
	}
	if s.store, err = store.Open(ctx, s.cfg.storeTarget()); err != nil {
		return err
	}
	m := metrics.New()
	s.serveHTTP(m)
	// The coordinator and the pool write through the leader's fenced
	// store; the API, whose writes any replica may make, through s.store.
	leaderStore := s.store
	// Before the lease: a standby checks tokens and speaks TLS too.
	if err := s.loadSecurity(); err != nil {
		return err
	}
	if s.cfg.replicated() {
		if err := s.startStandbyAPI(); err != nil {
			return err
		}
		// A standby sums reports for the leader while it waits.
		if err := s.startShardWorkers(); err != nil {
			return err
		}
		if s.leadership, err = s.lead(ctx); err != nil {
			return err
		}
		s.stopStandbyAPI()
		leaderStore = s.leadership.Store()
		s.keepLease(s.leadership)
		if err := s.openAudit(ctx); err != nil {
			return err
		}
	}
	var natsOpts []nats.Option
	var configure func(*natsserver.Options) error
	if !s.cfg.InsecureNATS {
		if s.natsAuthority == nil {
			if s.natsAuthority, err = s.loadNATSAuthority(); err != nil {
				return err
			}
		}
		if configure, err = s.natsAuthority.configure(ctx); err != nil {
			return err
		}
		user, err := s.natsAuthority.serviceOption()
		if err != nil {
			return err
		}
		natsOpts = append(natsOpts, user)
		if s.cfg.NATSURL != "" {
			if err := s.checkExternalNATS(ctx, s.cfg.NATSURL, user); err != nil {
				return err
			}
		}
	} else if s.cfg.NATSURL != "" {
		s.o.log.Warn("NATS runs without authorization (--insecure-nats): any client may use any subject, " +
			"device permissions and revocation do not apply")
	}
	// connectURL is where the server itself reaches NATS; s.natsURL, what
	// devices are told, differs for an embedded server on every interface.
	connectURL := s.cfg.NATSURL
	s.natsURL = s.cfg.NATSURL
	if s.cfg.NATSAdvertise != "" {
		s.natsURL = s.cfg.NATSAdvertise
	}
	if connectURL == "" {
		if s.cfg.NATSMonitor != "" {
			prev := configure
			configure = func(o *natsserver.Options) error {
				if err := natsembed.Monitor(o, s.cfg.NATSMonitor); err != nil {
					return err
				}
				if prev != nil {
					return prev(o)
				}
				return nil
			}
		}
		if s.cfg.NATSTLS {
			auth := configure
			configure = func(o *natsserver.Options) error {
				o.TLSConfig = s.tlsCA.ServerConfig(false)
				o.TLS, o.TLSTimeout = true, 5
				if auth != nil {
					return auth(o)
				}
				return nil
			}
		}
		s.embedded, err = natsx.StartEmbedded(s.cfg.NATSListen, filepath.Join(s.cfg.DataDir, "jetstream"),
			s.cfg.MaxMessageBytes, s.o.log.With("component", "nats"), configure)
		if err != nil {
			return err
		}
		if connectURL, s.natsURL, err = s.embeddedNATSURLs(s.embedded.ClientURL()); err != nil {
			return err
		}
	}
	natsOpts = append(natsOpts, s.natsTLSOptions()...)
	if s.nc, err = natsx.Connect(connectURL, "fleetlearn-server", s.o.log, natsOpts...); err != nil {
		return err
	}
	if s.natsAuthority != nil {
		if err := s.natsAuthority.connectSystem(connectURL); err != nil {
			return err
		}
		s.natsAuth = s.natsAuthority
	}
	if s.shardWorkers == nil && s.cfg.AggregationWorkers > 0 {
		if s.shardWorkers, err = coord.StartShardWorkers(s.nc, s.cfg.AggregationWorkers, s.o.log.With("component", "aggregation-worker")); err != nil {
			return err
		}
	}
	s.startCheckpoints(ctx)
	// Creating the stream fsyncs, and a cluster may be electing a leader:
	// nats.go's default of 5 s per API call fails a start on a busy disk.
	js, err := jetstream.New(s.nc, jetstream.WithDefaultTimeout(30*time.Second))
	if err != nil {
		return fmt.Errorf("server: jetstream: %w", err)
	}
	replicas := s.cfg.Replicas
	switch {
	case s.embedded != nil:
		replicas = 1
	case replicas == 0:
		if replicas, err = s.clusterReplicas(ctx); err != nil {
			return err
		}
	}
	stream, obs, err := s.setupJetStream(ctx, js, replicas)
	if err != nil {
		return err
	}
	if err := s.checkReplicas(ctx, stream, replicas); err != nil {
		return err
	}
	cacheDir := s.cfg.CacheDir
	if cacheDir == "" {
		cacheDir = filepath.Join(s.cfg.DataDir, "wasm-cache")
	}
	if s.sandbox, err = wasm.New(wasm.WithCacheDir(cacheDir),
		wasm.WithLogger(s.o.log.With("component", "wasm"))); err != nil {
		return err
	}
	bl := blobs.New(js, obs)
	s.runMu.Lock()
	defer s.runMu.Unlock() // until Start returns: a lost lease stops what started
	if s.deposed.Load() {
		return errors.New("server: lost the lease while starting")
	}
	s.coord = coord.New(coord.Deps{Store: leaderStore, NC: s.nc, JS: js, Stream: stream, Blobs: bl, Sandbox: s.sandbox,
		Metrics: m, Log: s.o.log.With("component", "coord"), Clock: s.o.clock, Rand: s.o.rand, PaceWindow: s.cfg.PaceWindow,
		Audit: s.recordBatch, Audited: s.audited, DeviceKey: s.deviceKey, RequireEnrollment: s.natsAuthority != nil,
		Tracer: s.o.tracer, Memory: memlimit.Process(s.memoryHeadroom()), ShardAggregation: s.cfg.ShardAggregation,
		Pseudonym: s.audit.PseudonymizeDevice})
	if err := s.coord.Start(ctx); err != nil {
		return err
	}
	if err := s.startPool(ctx, leaderStore, bl, m); err != nil {
		return err
	}

	if s.grpc, err = s.newGRPCServer(bl, m); err != nil {
		return err
	}
	if s.grpcHandoff != nil {
		go s.grpc.Serve(s.grpcHandoff.Lend())
	} else {
		go s.grpc.Serve(s.grpcLn)
	}

	if err := s.startUI(m); err != nil {
		return err
	}
	s.warnUnreachable()
	s.started.Store(true)
	s.o.log.Info("aggregator started", "grpc", s.GRPCAddr(), "nats", s.natsURL, "metrics", s.MetricsAddr(), "ui", s.UIURL(), "data", s.cfg.DataDir)
	return nil
}

// serveHTTP serves /metrics, /healthz and /readyz from the start: a
// standby is alive (healthz) and says why it is not ready (readyz) while
// it waits for the lease.
func (s *Server) serveHTTP(m *metrics.M) {
	if s.httpLn == nil {
		return
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	healthcheck.Register(mux, s.Ready)
	s.http = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go s.http.Serve(s.httpLn)
}

// StoreFile is the SQLite file that holds an aggregator's state in its
// data directory, unless Config.Store names a PostgreSQL database.
func StoreFile(dataDir string) string { return filepath.Join(dataDir, "fleetlearn.db") }

// GRPCAddr is the address the gRPC API listens on.
func (s *Server) GRPCAddr() string {
	if s.grpcLn == nil {
		return ""
	}
	return s.grpcLn.Addr().String()
}

// MetricsAddr is the address /metrics is served on ("" when off).
func (s *Server) MetricsAddr() string {
	if s.httpLn == nil {
		return ""
	}
	return s.httpLn.Addr().String()
}

// NATSURL is the NATS URL devices connect to.
func (s *Server) NATSURL() string { return s.natsURL }

// Shutdown stops serving and closes state: API first, then the round runners
// (open rounds stay open, to be resumed), then the audit log (after a final
// checkpoint), then NATS and the database. Safe to call twice; later calls
// return the first result.
func (s *Server) Shutdown(ctx context.Context) error {
	s.shutdown.Do(func() {
		s.closing.Store(true)
		var errs []error
		// First of all: its event streams are watches on the API, which a
		// graceful stop of the API would wait for.
		errs = append(errs, s.stopUI(ctx))
		if s.pool != nil {
			// First: it ends the pool's long polls and waits, which would
			// hold up a graceful stop of the API.
			s.pool.Shutdown()
		}
		s.stopStandbyAPI()
		if s.grpc != nil {
			stopped := make(chan struct{})
			go func() { s.grpc.GracefulStop(); close(stopped) }()
			select {
			case <-stopped:
			case <-ctx.Done():
				s.grpc.Stop()
			}
		}
		if s.http != nil {
			errs = append(errs, s.http.Shutdown(ctx))
		}
		if s.coord != nil {
			s.coord.Shutdown()
		}
		if s.shardWorkers != nil {
			s.shardWorkers.Stop()
		}
		if s.shardNC != nil {
			s.shardNC.Close()
		}
		errs = append(errs, s.closeAudit(ctx))
		// After the last write: the next leader starts from all of it.
		s.stopLease()
		if s.nc != nil {
			s.nc.Drain()
			s.nc.Close()
		}
		if s.natsAuthority != nil {
			s.natsAuthority.close()
		}
		if s.embedded != nil {
			s.embedded.Shutdown()
		}
		if s.sandbox != nil {
			errs = append(errs, s.sandbox.Close(ctx))
		}
		if s.store != nil {
			errs = append(errs, s.store.Close())
		}
		s.closeListeners()
		s.err = errors.Join(errs...)
	})
	return s.err
}

// checkPublicConfig refuses a PublicHost or NATSMonitor that cannot work
// before anything is created, and adds PublicHost to the certificate's
// names.
func checkPublicConfig(cfg *Config) error {
	if h := cfg.PublicHost; h != "" {
		ip := net.ParseIP(h)
		if ip == nil && !isDNSName(h) || ip != nil && ip.IsUnspecified() {
			return fmt.Errorf("server: public host %q: give the DNS name or IP address devices reach the server by, without a port", h)
		}
		cfg.TLSHosts = append(slices.Clone(cfg.TLSHosts), h)
	}
	if cfg.NATSMonitor != "" {
		if cfg.NATSURL != "" {
			return errors.New("server: NATS monitoring (NATSMonitor) is served by the embedded NATS server; " +
				"with an external cluster (NATSURL), enable http_port in the cluster's own configuration")
		}
		if err := natsembed.Monitor(new(natsserver.Options), cfg.NATSMonitor); err != nil {
			return fmt.Errorf("server: %w", err)
		}
	}
	return nil
}

// isDNSName reports whether h looks like a host name: letters, digits,
// hyphens and dots, at most 253 characters.
func isDNSName(h string) bool {
	return len(h) <= 253 && strings.Trim(h, ".") != "" && !strings.ContainsFunc(h, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.')
	})
}

// anyHost is the listen host for every interface of publicHost's family:
// nats-server listens on one address family (an IPv4 "0.0.0.0" unless told
// "::").
func anyHost(publicHost string) string {
	if ip := net.ParseIP(publicHost); ip != nil && ip.To4() == nil {
		return "[::]"
	}
	return "0.0.0.0"
}

// embeddedNATSURLs returns the URL the server dials its embedded NATS
// server at and the one devices get at enrollment (Server.NATSURL), from
// the server's client URL. On every interface ("0.0.0.0", "::") the server
// dials loopback, which its certificate covers, while devices get
// NATSAdvertise, else PublicHost (checkAdvertise made sure there is one); a
// loopback listener is offered as it is. The tls scheme tells clients,
// enrolled agents included, to insist on TLS.
func (s *Server) embeddedNATSURLs(clientURL string) (connect, devices string, err error) {
	u, err := url.Parse(clientURL)
	if err != nil {
		return "", "", fmt.Errorf("server: embedded NATS URL %q: %w", clientURL, err)
	}
	if s.cfg.NATSTLS {
		u.Scheme = "tls"
	}
	host, port := u.Hostname(), u.Port()
	ip := net.ParseIP(host)
	local := host
	if ip != nil && ip.IsUnspecified() {
		local = "127.0.0.1"
		if ip.To4() == nil {
			local = "::1"
		}
	}
	c, d := *u, *u
	c.Host = net.JoinHostPort(local, port)
	switch {
	case s.cfg.NATSAdvertise != "":
		return c.String(), s.cfg.NATSAdvertise, nil
	case ip != nil && ip.IsLoopback():
		d.Host = c.Host
	case s.cfg.PublicHost != "":
		d.Host = net.JoinHostPort(s.cfg.PublicHost, port)
	case ip != nil && ip.IsUnspecified():
		// checkAdvertise refuses this configuration; a listener that
		// resolved to every interface anyway must not be handed out.
		return "", "", fmt.Errorf("server: NATS listens on every interface (%s): %w", clientURL, errNoAdvertise)
	}
	return c.String(), d.String(), nil
}

// errNoAdvertise says what to set when devices would be handed an address
// they cannot dial.
var errNoAdvertise = errors.New("devices must be given an address they can dial: " +
	"set --public-host HOST (the name devices reach this server by) or --nats-advertise URL")

// checkAdvertise refuses a configuration that would hand enrolling devices
// an unspecified address (0.0.0.0, ::), or an advertised URL that is not
// one.
func checkAdvertise(cfg Config) error {
	if cfg.NATSAdvertise != "" {
		if err := checkDialableURLs(cfg.NATSAdvertise); err != nil {
			return fmt.Errorf("server: --nats-advertise: %w", err)
		}
		return nil
	}
	if cfg.NATSURL != "" {
		if err := checkDialableURLs(cfg.NATSURL); err != nil {
			return fmt.Errorf("server: --nats-url %s is what devices would be given: %w; %w", cfg.NATSURL, err, errNoAdvertise)
		}
		return nil
	}
	if cfg.PublicHost != "" {
		return nil
	}
	host, _, err := net.SplitHostPort(cfg.NATSListen)
	if err != nil {
		return fmt.Errorf("server: --nats-listen %q: want host:port", cfg.NATSListen)
	}
	if everyInterface(host) {
		return fmt.Errorf("server: NATS listens on every interface (--nats-listen %s): %w", cfg.NATSListen, errNoAdvertise)
	}
	return nil
}

// isLoopback reports whether a listen host is this machine only.
func isLoopback(host string) bool {
	ip := net.ParseIP(host)
	return host == "localhost" || ip != nil && ip.IsLoopback()
}

// everyInterface reports whether a listen or URL host means every
// interface ("", 0.0.0.0, ::): an address to listen on, never one to dial.
func everyInterface(host string) bool {
	ip := net.ParseIP(host)
	return host == "" || ip != nil && ip.IsUnspecified()
}

// checkDialableURLs checks comma-separated NATS URLs: each parses, has a
// NATS scheme and a host that is not unspecified (the port may be left to
// the clients' default, 4222).
func checkDialableURLs(urls string) error {
	for raw := range strings.SplitSeq(urls, ",") {
		raw = strings.TrimSpace(raw)
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" {
			return fmt.Errorf("%q is not a URL such as nats://nats.example.net:4222", raw)
		}
		switch u.Scheme {
		case "nats", "tls", "ws", "wss":
		default:
			return fmt.Errorf("%q: the scheme must be nats, tls, ws or wss", raw)
		}
		if everyInterface(u.Hostname()) {
			return fmt.Errorf("%q has an unspecified host, which no device can dial", raw)
		}
	}
	return nil
}

// warnUnreachable says when PublicHost promises what a loopback listener
// cannot keep.
func (s *Server) warnUnreachable() {
	if s.cfg.PublicHost == "" {
		return
	}
	addrs := map[string]string{"grpc": s.GRPCAddr()}
	if s.embedded != nil {
		addrs["nats"] = s.cfg.NATSListen
	}
	for what, addr := range addrs {
		h, _, err := net.SplitHostPort(addr)
		if err == nil && isLoopback(h) {
			s.o.log.Warn("the public host is set but this listener is on loopback: other hosts cannot reach it",
				"public_host", s.cfg.PublicHost, what, addr)
		}
	}
}

func (s *Server) memoryHeadroom() int64 {
	switch n := s.cfg.MemoryHeadroom; {
	case n == 0:
		return DefaultMemoryHeadroom
	case n < 0:
		return 0
	default:
		return n
	}
}
