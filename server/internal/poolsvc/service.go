package poolsvc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/internal/clock"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/pool"
	"github.com/fleetlearn/fleetlearn/pool/carbon"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/metrics"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
)

// Defaults of Deps.
const (
	DefaultHeartbeatInterval = 2 * time.Second
	DefaultHeartbeatsToLoss  = 3
	DefaultTenant            = "default"
	// DefaultMaxJobStorage caps one job's checkpoints on the server.
	DefaultMaxJobStorage int64 = 64 << 30
	// MaxLogLines are kept per job; older lines are dropped.
	MaxLogLines = 10_000
	// MaxLogLineBytes bounds one log line.
	MaxLogLineBytes = 4096
	// MaxBlobBytes bounds one checkpoint blob: the checkpoint chunk size.
	MaxBlobBytes = 4 << 20
	// DefaultMaxWorkersPerPrincipal caps the live workers one pool-worker
	// token holds. Tokens are minted one per machine, and an agent holds
	// one worker; the rest is room for an agent restarted before the
	// server has declared its previous worker lost.
	DefaultMaxWorkersPerPrincipal = 4
	// DefaultStartTimeout is how long a worker has to report a rank it was
	// leased (in a heartbeat, or its exit) before the lease is revoked. An
	// honest agent lists it in its next heartbeat; the time covers a rank
	// that ended at once and whose exit report the agent is still retrying
	// (for up to 30 s).
	DefaultStartTimeout = time.Minute
)

// ModelSink stores a pool-trained model as a model version of family name
// (source MODEL_SOURCE_POOL, with lineage) and returns it. The service
// records the audit events itself.
type ModelSink func(ctx context.Context, name string, m *model.Model, lineage *pb.PoolLineage) (*pb.Model, error)

// Deps are the service's collaborators and settings.
type Deps struct {
	Store *store.Store // required
	Clock clock.Clock  // nil: the system clock
	Log   *slog.Logger // nil: discard
	// CheckpointDir holds the ranks' checkpoint stores (DataDir/pool/checkpoints).
	CheckpointDir string // required
	// Audit records events in one batch: all or none (required).
	Audit func(ctx context.Context, ps ...audit.Payload) error
	// StoreModel receives a succeeded job's model (required).
	StoreModel ModelSink
	// CreateTask creates a job's then_task (required).
	CreateTask func(ctx context.Context, t *pb.Task) (*pb.Task, error)
	// Tenants are the queues; nil or empty is one tenant "default" with
	// weight 1, no quota and no budget.
	Tenants map[string]pool.Tenant
	// HeartbeatInterval is how long a heartbeat long poll waits (default
	// 2 s); a worker is lost after HeartbeatsToLoss (default 3) intervals
	// without a call.
	HeartbeatInterval time.Duration
	HeartbeatsToLoss  int
	// MaxJobStorageBytes caps one job's checkpoint bytes (default 64 GiB).
	// A built-in job whose model size is known from its spec is capped
	// lower, at what its ranks' kept checkpoints can hold.
	MaxJobStorageBytes int64
	// MaxWorkersPerPrincipal caps the live (not lost) workers registered
	// with one pool-worker token (default DefaultMaxWorkersPerPrincipal).
	MaxWorkersPerPrincipal int
	// StartTimeout is how long a leased rank may go unreported by its
	// worker while the worker keeps calling (default DefaultStartTimeout);
	// then the lease is revoked, the job requeued, and the worker
	// distrusted for WorkerDistrust (pool.Config.Distrust).
	StartTimeout   time.Duration
	WorkerDistrust time.Duration
	// Carbon is the carbon intensity forecast, read at each submission of
	// a job with spec.carbon and when such a job ends; nil refuses those
	// jobs.
	Carbon carbon.Source
	// Kube runs jobs whose spec asks for the Kubernetes executor; nil
	// refuses them.
	Kube KubeExecutor
	// KubeCheckpointDir is where the server sees the volume the pods keep
	// their checkpoints on (kube.Config.CheckpointClaim); empty, a
	// Kubernetes job's progress and model are not read.
	KubeCheckpointDir string
	// Metrics receives the pool's usage and reads its jobs and workers at
	// scrape time; nil keeps them on a registry of their own.
	Metrics *metrics.M
}

// Service is the job service.
type Service struct {
	d     Deps
	clk   clock.Clock
	log   *slog.Logger
	sched *pool.Scheduler
	ckpt  *ckptStores
	logs  *notifier

	reqs chan func()
	stop chan struct{}
	// kubeDone ends the JobSet watch at Shutdown.
	kubeStop context.CancelFunc
	kubeDone chan struct{}
	done     chan struct{}
	stopOnce sync.Once
	started  bool

	// Owned by the loop goroutine.
	jobs    map[string]*jobRT
	workers map[string]*workerRT
	// strikes are the no-start records of principals (pool-worker
	// tokens), handed to each worker they register, so registering again
	// does not clear them. Only principals that left a lease unstarted
	// have one.
	strikes map[principalKey]strikeRec
	// streams are the ranks' open Average and OuterSync calls.
	streams map[rankAttempt]*rankStreams
	passes  uint64
	timer   clock.Timer

	// onPoll, when set (tests), is called by the loop when a heartbeat
	// begins to wait.
	onPoll func(worker string)
}

// New checks deps and builds the scheduler; Start restores state.
func New(d Deps) (*Service, error) {
	switch {
	case d.Store == nil, d.CheckpointDir == "", d.Audit == nil, d.StoreModel == nil, d.CreateTask == nil:
		return nil, fmt.Errorf("poolsvc: new: store, checkpoint dir, audit, model sink and task creation are required: %w", ErrConfig)
	case d.HeartbeatInterval < 0 || d.HeartbeatsToLoss < 0 || d.MaxJobStorageBytes < 0 || d.MaxWorkersPerPrincipal < 0 ||
		d.StartTimeout < 0 || d.WorkerDistrust < 0:
		return nil, fmt.Errorf("poolsvc: new: negative heartbeat or storage setting: %w", ErrConfig)
	}
	if d.HeartbeatInterval == 0 {
		d.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if d.HeartbeatInterval < 10*time.Millisecond || d.HeartbeatInterval > time.Hour {
		return nil, fmt.Errorf("poolsvc: new: heartbeat interval %s outside [10ms, 1h]: %w", d.HeartbeatInterval, ErrConfig)
	}
	if d.HeartbeatsToLoss == 0 {
		d.HeartbeatsToLoss = DefaultHeartbeatsToLoss
	}
	if d.HeartbeatsToLoss > 100 {
		return nil, fmt.Errorf("poolsvc: new: heartbeats to loss %d over 100: %w", d.HeartbeatsToLoss, ErrConfig)
	}
	if d.MaxJobStorageBytes == 0 {
		d.MaxJobStorageBytes = DefaultMaxJobStorage
	}
	if d.MaxWorkersPerPrincipal == 0 {
		d.MaxWorkersPerPrincipal = DefaultMaxWorkersPerPrincipal
	}
	if d.MaxWorkersPerPrincipal > MaxWorkers {
		return nil, fmt.Errorf("poolsvc: new: %d workers per token, more than the pool's %d: %w", d.MaxWorkersPerPrincipal, MaxWorkers, ErrConfig)
	}
	if d.StartTimeout == 0 {
		d.StartTimeout = DefaultStartTimeout
	}
	if len(d.Tenants) == 0 {
		d.Tenants = map[string]pool.Tenant{DefaultTenant: {Weight: 1}}
	}
	d.Tenants = maps.Clone(d.Tenants)
	d.Clock = clock.Or(d.Clock)
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	if d.Metrics == nil {
		d.Metrics = metrics.New()
	}
	sched, err := pool.NewScheduler(pool.Config{Tenants: d.Tenants, Clock: d.Clock, Distrust: d.WorkerDistrust})
	if err != nil {
		return nil, fmt.Errorf("poolsvc: new: %w", err)
	}
	s := &Service{d: d, clk: d.Clock, log: d.Log, sched: sched,
		ckpt: newCkptStores(d.CheckpointDir, d.MaxJobStorageBytes), logs: newNotifier(),
		reqs: make(chan func()), stop: make(chan struct{}), done: make(chan struct{}),
		jobs: map[string]*jobRT{}, workers: map[string]*workerRT{}, strikes: map[principalKey]strikeRec{},
		streams: map[rankAttempt]*rankStreams{}}
	d.Metrics.SetPool(s.poolCounts)
	return s, nil
}

// Start restores jobs and workers from the store and starts the loop. Jobs
// that were queued or running come back queued from their committed step;
// workers must register again.
func (s *Service) Start(ctx context.Context) error {
	if s.started {
		return fmt.Errorf("poolsvc: start: already started: %w", ErrConfig)
	}
	if err := s.clearSpools(); err != nil {
		return err
	}
	if err := s.restore(ctx); err != nil {
		return err
	}
	s.started = true
	go s.loop()
	if s.d.Kube != nil {
		ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		s.kubeStop, s.kubeDone = cancel, make(chan struct{})
		go func() {
			defer close(s.kubeDone)
			s.watchKube(ctx)
		}()
	}
	return nil
}

// Shutdown stops the loop and ends every waiting call. Safe to call twice.
func (s *Service) Shutdown() {
	s.stopOnce.Do(func() {
		if s.kubeStop != nil {
			s.kubeStop()
			<-s.kubeDone
		}
		close(s.stop)
		if s.started {
			<-s.done
		}
	})
}

// Register adds both services to r.
func (s *Service) Register(r grpc.ServiceRegistrar) {
	apiv1.RegisterPoolServiceServer(r, &jobServer{s: s})
	apiv1.RegisterPoolWorkerServiceServer(r, &workerServer{s: s})
}

func (s *Service) loop() {
	defer close(s.done)
	tick := s.clk.NewTicker(s.d.HeartbeatInterval)
	defer tick.Stop()
	s.armTimer()
	for {
		var timerC <-chan time.Time
		if s.timer != nil {
			timerC = s.timer.C()
		}
		select {
		case <-s.stop:
			s.closeAll()
			return
		case fn := <-s.reqs:
			fn()
		case <-timerC:
			s.timer = nil
			s.expire()
		case <-tick.C():
			s.expire()
		}
		s.pass()
		s.armTimer()
	}
}

// do runs fn on the loop goroutine, followed by a scheduling pass, and
// returns its error.
func (s *Service) do(ctx context.Context, fn func() error) error {
	res := make(chan error, 1)
	wrapped := func() { res <- fn() }
	select {
	case s.reqs <- wrapped:
	case <-s.stop:
		return errorf(codes.Unavailable, "pool service shutting down")
	case <-ctx.Done():
		return errorf(codes.Canceled, "%v", ctx.Err())
	}
	// Once taken, fn runs to the end; the result channel is buffered.
	select {
	case err := <-res:
		return err
	case <-s.done:
		select {
		case err := <-res:
			return err
		default:
			return errorf(codes.Unavailable, "pool service shutting down")
		}
	}
}

// armTimer sets the timer to the earliest worker-loss or handoff deadline.
func (s *Service) armTimer() {
	var next time.Time
	for _, w := range s.workers {
		if !w.lost {
			if dl := w.lastSeen.Add(s.lossAfter()); next.IsZero() || dl.Before(next) {
				next = dl
			}
		}
	}
	now := s.clk.Now()
	for _, rt := range s.jobs {
		// A carbon job waiting for its window is placed on time, not at
		// the next heartbeat tick.
		if nb := rt.spec.NotBefore; rt.rec.GetState() == pb.PoolJobState_POOL_JOB_STATE_QUEUED && nb.After(now) &&
			(next.IsZero() || nb.Before(next)) {
			next = nb
		}
		if rt.handoffDue.IsZero() {
			continue
		}
		if next.IsZero() || rt.handoffDue.Before(next) {
			next = rt.handoffDue
		}
	}
	if dl := s.dilocoDeadline(); !dl.IsZero() && (next.IsZero() || dl.Before(next)) {
		next = dl
	}
	if dl := s.startDeadline(); !dl.IsZero() && (next.IsZero() || dl.Before(next)) {
		next = dl
	}
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
	if next.IsZero() {
		return
	}
	s.timer = s.clk.NewTimer(max(next.Sub(s.clk.Now()), 0))
}

func (s *Service) lossAfter() time.Duration {
	return time.Duration(s.d.HeartbeatsToLoss) * s.d.HeartbeatInterval
}

// retainEnded is how long an ended job waits in memory for its ranks'
// exits: a command rank has a grace period between SIGTERM and SIGKILL and
// uploads its last checkpoint first.
func (s *Service) retainEnded() time.Duration { return max(10*s.lossAfter(), time.Minute) }

// closeAll ends every waiter at shutdown.
func (s *Service) closeAll() {
	for _, w := range s.workers {
		w.signal()
	}
	for _, rt := range s.jobs {
		rt.abortSync("the server is shutting down")
		if d := rt.diloco; d != nil {
			for _, r := range []*outerRound{d.open, d.closing} {
				if r != nil {
					r.end(errorf(codes.Unavailable, "pool service shutting down"))
				}
			}
			d.open, d.closing = nil, nil
		}
		rt.notify()
	}
}

func newID(prefix string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

func (s *Service) audit(ctx context.Context, ps ...audit.Payload) error {
	if err := s.d.Audit(context.WithoutCancel(ctx), ps...); err != nil {
		s.log.ErrorContext(ctx, "pool audit record failed", "err", err)
		return err
	}
	return nil
}
