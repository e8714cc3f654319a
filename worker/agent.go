package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fleetlearn/fleetlearn/model/kernel"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/client"
	"github.com/fleetlearn/fleetlearn/internal/backoff"
	"github.com/fleetlearn/fleetlearn/internal/clock"
	"github.com/fleetlearn/fleetlearn/internal/version"
	"github.com/fleetlearn/fleetlearn/pool/checkpoint"
	"github.com/fleetlearn/fleetlearn/pool/stepdir"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/worker/internal/cmdckpt"
	"github.com/fleetlearn/fleetlearn/worker/internal/detect"
	"github.com/fleetlearn/fleetlearn/worker/internal/meter"
	"github.com/fleetlearn/fleetlearn/worker/internal/remote"
	"github.com/fleetlearn/fleetlearn/worker/internal/runner"
)

const leaseFileName = "lease.json"

// Bounds on what a heartbeat answer may ask for at once.
const (
	maxLeasesPerBeat = 1024
	maxRanks         = 4096
	// builtinMaster is the rendezvous address the runner requires; a
	// built-in trainer rank has no rendezvous of its own (it averages
	// through the server), so the value is never used.
	builtinMaster = "127.0.0.1"
	builtinPort   = 29500
)

// Agent is a pool worker: it registers with the server, heartbeats, and runs
// the ranks it is leased as child processes.
type Agent struct {
	cfg Config
	log *slog.Logger
	clk clock.Clock

	// smi is nvidia-smi's path where it is on PATH: ranks that hold GPUs
	// are metered through it (power and utilization).
	smi string

	mu    sync.Mutex
	ranks map[rankKey]*rankRun
	wg    sync.WaitGroup
}

type rankKey struct {
	job           string
	attempt, rank uint32
}

// New checks cfg and returns an Agent; it connects nowhere yet.
func New(cfg Config) (*Agent, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if len(cfg.RankCommand) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("worker: new: %w: cannot find this executable for the rank command (%v): set RankCommand", ErrConfig, err)
		}
		cfg.RankCommand = []string{exe, "rank"}
	}
	if cfg.Name == "" {
		cfg.Name, _ = os.Hostname()
	}
	if err := os.MkdirAll(cfg.WorkDir, 0o700); err != nil {
		return nil, fmt.Errorf("worker: new: work directory: %w", err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	a := &Agent{cfg: cfg, log: log, clk: clock.Or(cfg.Clock), ranks: map[rankKey]*rankRun{}}
	if p, err := exec.LookPath("nvidia-smi"); err == nil {
		a.smi = p
	}
	return a, nil
}

func (a *Agent) capacity(ctx context.Context) (*pb.PoolResources, []string, error) {
	c := a.cfg.Capacity
	if c.MilliCPU > 0 && c.MemoryBytes > 0 {
		return &pb.PoolResources{MilliCpu: c.MilliCPU, MemoryBytes: c.MemoryBytes, Gpus: int64(len(c.GPUModels))}, c.GPUModels, nil
	}
	r, err := detect.Detect(ctx, detect.Options{})
	if err != nil {
		return nil, nil, fmt.Errorf("worker: detect resources: %w (give --cpus and --memory to skip detection)", err)
	}
	if r.GPUError != nil {
		a.log.Warn("GPUs not detected; offering CPUs only", "err", r.GPUError)
	}
	res := &pb.PoolResources{MilliCpu: int64(math.Floor(r.EffectiveCPUs() * 1000)), MemoryBytes: int64(min(r.MemoryBytes, math.MaxInt64))}
	if c.MilliCPU > 0 {
		res.MilliCpu = c.MilliCPU
	}
	if c.MemoryBytes > 0 {
		res.MemoryBytes = c.MemoryBytes
	}
	var models []string
	for _, g := range r.GPUs {
		models = append(models, g.Name)
	}
	res.Gpus = int64(len(models))
	return res, models, nil
}

func (a *Agent) dial() (*grpc.ClientConn, error) {
	opts := []client.DialOption{client.WithToken(a.cfg.Token), client.WithGRPCOptions(grpc.WithDefaultCallOptions(remote.CallOptions()...))}
	switch {
	case a.cfg.Insecure:
		opts = append(opts, client.WithInsecure())
	case len(a.cfg.CAPEM) > 0:
		opts = append(opts, client.WithCA(a.cfg.CAPEM))
	}
	return client.Dial(a.cfg.Server, opts...)
}

// refused is an error no retry fixes: the operator must act.
func refused(op string, err error) error {
	switch status.Code(err) {
	case codes.Unauthenticated:
		return fmt.Errorf("worker: %s: %w: the token was not accepted (%v): mint a new one with 'fleetlearn token mint --data-dir DIR --subject NAME --role pool-worker'", op, ErrRefused, err)
	case codes.PermissionDenied:
		return fmt.Errorf("worker: %s: %w: the token lacks the pool-worker role (%v): mint one with 'fleetlearn token mint --data-dir DIR --subject NAME --role pool-worker'", op, ErrRefused, err)
	}
	return nil
}

// Run registers, heartbeats and runs ranks until ctx ends; then it stops
// every rank (SIGTERM, SIGKILL after the grace period), reports them and
// returns ctx's error. It returns early only when the server refuses the
// worker for good (ErrRefused).
func (a *Agent) Run(ctx context.Context) error {
	conn, err := a.dial()
	if err != nil {
		return fmt.Errorf("worker: run: %w", err)
	}
	defer conn.Close()
	c := apiv1.NewPoolWorkerServiceClient(conn)
	defer a.stopAll("agent stopping")
	capRes, gpus, err := a.capacity(ctx)
	if err != nil {
		return err
	}
	b := backoff.New(500*time.Millisecond, 30*time.Second, backoff.Jitter(rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))))
	var id string
	var interval time.Duration
	for ctx.Err() == nil {
		if id == "" {
			r, err := c.RegisterWorker(ctx, &pb.RegisterWorkerRequest{Name: a.cfg.Name, Capacity: capRes, GpuModels: gpus, Version: version.Get().Version, Zone: a.cfg.Zone})
			if err != nil {
				if rerr := refused("register", err); rerr != nil {
					return rerr
				}
				a.log.Warn("cannot register with the pool server; retrying", "server", a.cfg.Server, "err", err)
				clock.Sleep(a.clk, b.Next(), ctx.Done())
				continue
			}
			if r.GetWorkerId() == "" || len(r.GetWorkerId()) > 256 {
				return fmt.Errorf("worker: register: %w: server sent worker id %.80q", ErrRefused, r.GetWorkerId())
			}
			id, interval = r.GetWorkerId(), r.GetHeartbeatInterval().AsDuration()
			interval = min(max(interval, 100*time.Millisecond), 10*time.Minute)
			a.log.Info("registered with the pool", "worker", id, "heartbeat", interval, "milli_cpu", capRes.GetMilliCpu(), "memory", capRes.GetMemoryBytes(), "gpus", capRes.GetGpus(), "gemm_kernel", kernel.KernelName())
			b.Reset()
		}
		// The server holds a heartbeat up to interval; the timeout is a
		// guard against a connection that hangs, not the pace.
		hctx, cancel := context.WithTimeout(ctx, 2*interval+30*time.Second)
		resp, err := c.Heartbeat(hctx, &pb.HeartbeatRequest{WorkerId: id, Ranks: a.statuses()})
		cancel()
		switch {
		case err == nil:
			b.Reset()
			a.handle(ctx, c, id, resp)
		case ctx.Err() != nil:
		case status.Code(err) == codes.NotFound:
			a.log.Warn("the server forgot this worker; stopping its ranks and registering again", "worker", id)
			a.stopAll("worker re-registering")
			id = ""
		default:
			if rerr := refused("heartbeat", err); rerr != nil {
				return rerr
			}
			a.log.Warn("heartbeat failed; retrying", "err", err)
			clock.Sleep(a.clk, b.Next(), ctx.Done())
		}
	}
	return ctx.Err()
}

func (a *Agent) statuses() []*pb.RankStatus {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]*pb.RankStatus, 0, len(a.ranks))
	for k, r := range a.ranks {
		step, loss := r.progress()
		out = append(out, &pb.RankStatus{JobId: k.job, Attempt: k.attempt, Rank: k.rank, Step: step, Loss: loss, Usage: r.usage(false)})
	}
	return out
}

func (a *Agent) handle(ctx context.Context, c apiv1.PoolWorkerServiceClient, id string, resp *pb.HeartbeatResponse) {
	for _, s := range resp.GetStop() {
		a.mu.Lock()
		var hit []*rankRun
		for k, r := range a.ranks {
			if k.job == s.GetJobId() && k.attempt == s.GetAttempt() {
				hit = append(hit, r)
			}
		}
		a.mu.Unlock()
		for _, r := range hit {
			a.log.Info("stopping rank", "job", r.key.job, "attempt", r.key.attempt, "rank", r.key.rank, "at_checkpoint", s.GetAtCheckpoint(), "reason", s.GetReason())
			r.stop(s.GetAtCheckpoint())
		}
	}
	starts := resp.GetStart()
	if len(starts) > maxLeasesPerBeat {
		a.log.Warn("heartbeat answer with too many leases; taking the first", "leases", len(starts), "limit", maxLeasesPerBeat)
		starts = starts[:maxLeasesPerBeat]
	}
	for _, l := range starts {
		k := rankKey{l.GetJobId(), l.GetAttempt(), l.GetRank()}
		a.mu.Lock()
		_, running := a.ranks[k]
		full := len(a.ranks) >= maxRanks
		a.mu.Unlock()
		if running {
			continue
		}
		ref := &pb.RankRef{WorkerId: id, JobId: k.job, Attempt: k.attempt, Rank: k.rank}
		if full {
			a.reportExit(c, &pb.RankExitedRequest{WorkerId: id, JobId: k.job, Attempt: k.attempt, Rank: k.rank, Error: "worker runs too many ranks", ExitCode: -1})
			continue
		}
		r, rs, err := a.prepareRank(c, ref, l)
		if err != nil {
			a.log.Warn("rank did not start", "job", k.job, "attempt", k.attempt, "rank", k.rank, "err", err)
			a.reportExit(c, &pb.RankExitedRequest{WorkerId: id, JobId: k.job, Attempt: k.attempt, Rank: k.rank, Error: oneLine(err.Error()), ExitCode: -1})
			continue
		}
		a.mu.Lock()
		a.ranks[k] = r
		a.mu.Unlock()
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			ex := a.runRank(r, rs)
			a.mu.Lock()
			delete(a.ranks, k)
			a.mu.Unlock()
			a.reportExit(c, ex)
		}()
	}
}

// reportExit tells the server a rank ended. It is sent even while the agent
// stops, with a bounded wait, so that the job is rescheduled at once
// rather than when the worker is declared lost.
func (a *Agent) reportExit(c apiv1.PoolWorkerServiceClient, ex *pb.RankExitedRequest) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := remote.Retry{Initial: 200 * time.Millisecond, Max: 5 * time.Second, Attempts: 6, Clock: a.clk}.Do(ctx, func(ctx context.Context) error {
		_, err := c.RankExited(ctx, ex)
		return err
	})
	if err != nil {
		a.log.Warn("could not report a rank's end", "job", ex.GetJobId(), "attempt", ex.GetAttempt(), "rank", ex.GetRank(), "err", err)
		return
	}
	a.log.Info("rank ended", "job", ex.GetJobId(), "attempt", ex.GetAttempt(), "rank", ex.GetRank(),
		"completed", ex.GetCompleted(), "stopped", ex.GetStopped(), "error", ex.GetError(), "exit_code", ex.GetExitCode())
}

// stopAll stops every rank at once and waits for them and their reports.
func (a *Agent) stopAll(why string) {
	a.mu.Lock()
	rs := make([]*rankRun, 0, len(a.ranks))
	for _, r := range a.ranks {
		rs = append(rs, r)
	}
	a.mu.Unlock()
	for _, r := range rs {
		a.log.Info("stopping rank", "job", r.key.job, "attempt", r.key.attempt, "rank", r.key.rank, "reason", why)
		r.stop(false)
	}
	a.wg.Wait()
}

// rankRun is one running rank.
type rankRun struct {
	key     rankKey
	ref     *pb.RankRef
	builtin bool
	lease   *pb.RankLease
	logs    *logShipper
	clk     clock.Clock
	start   time.Time
	ckptDir string
	// store is the server's checkpoint store of a command rank, and
	// cancel ends its calls once the rank is reported.
	store     *remote.Store
	cancel    context.CancelFunc
	watchDone chan struct{}

	mu         sync.Mutex
	proc       *runner.Process // nil until started
	meter      *meter.Meter    // nil until started, or where metering could not start
	step       int64
	loss       float64
	digest     string
	errLine    string
	stopAsked  bool
	stopAtCkpt bool
	uploaded   int64 // the last step directory a command rank uploaded
}

func (r *rankRun) progress() (int64, float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.step, r.loss
}

func (r *rankRun) usage(final bool) *pb.PoolUsage {
	r.mu.Lock()
	m := r.meter
	r.mu.Unlock()
	var u meter.Usage
	switch {
	case m == nil:
		u.Backend, u.EnergySource = "none", meter.EnergyUnavailable
	case final:
		u = m.Stop()
	default:
		u = m.Sample()
	}
	gpus := r.lease.GetSpec().GetPerRank().GetGpus()
	out := &pb.PoolUsage{
		CpuSeconds:      u.CPUSeconds,
		GpuSeconds:      float64(gpus) * r.clk.Now().Sub(r.start).Seconds(),
		PeakMemoryBytes: int64(min(u.PeakMemoryBytes, math.MaxInt64)),
		EnergyJoules:    u.EnergyJoules,
		Meter:           u.Backend,
		EnergySource:    u.EnergySource,
	}
	if u.GPUMetered {
		out.GpuBusySeconds, out.GpuMeter = u.GPUBusySeconds, "nvidia-smi"
	}
	return out
}

// stop asks the rank to stop: at its next checkpoint, or now. A rank not
// started yet is not started.
func (r *rankRun) stop(atCheckpoint bool) {
	r.mu.Lock()
	r.stopAsked = true
	proc := r.proc
	if atCheckpoint && !r.builtin {
		// A command knows no such signal: the agent stops it once its
		// next step-N directory is uploaded.
		r.stopAtCkpt = true
	}
	r.mu.Unlock()
	switch {
	case proc == nil:
	case !atCheckpoint:
		proc.Stop()
	case r.builtin:
		proc.Signal(StopAtCheckpointSignal)
	}
}

// onLine takes a rank's output: report lines of a built-in rank update its
// progress, everything else goes to the job's log.
func (r *rankRun) onLine(st runner.Stream, line string) {
	if r.builtin && st == runner.Stdout {
		if rest, ok := strings.CutPrefix(line, reportPrefix); ok {
			r.parseReport(rest)
			return
		}
	}
	stream := "stdout"
	if st == runner.Stderr {
		stream = "stderr"
	}
	r.logs.add(stream, line)
}

func (r *rankRun) parseReport(s string) {
	kind, arg, _ := strings.Cut(s, " ")
	r.mu.Lock()
	defer r.mu.Unlock()
	switch kind {
	case reportProgress:
		st, l, _ := strings.Cut(arg, " ")
		step, err1 := strconv.ParseInt(st, 10, 64)
		loss, err2 := strconv.ParseFloat(l, 64)
		if err1 == nil && err2 == nil && step >= r.step && step <= r.lease.GetSpec().GetTotalSteps() {
			r.step, r.loss = step, loss
		}
	case reportData:
		if len(arg) == 64 {
			r.digest = arg
		}
	case reportError:
		r.errLine = arg
	}
}

func (a *Agent) rankDir(k rankKey) string {
	return filepath.Join(a.cfg.WorkDir, "ranks", fmt.Sprintf("%s-r%d", k.job, k.rank))
}

func validName(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// prepareRank checks the lease l and readies the rank's directories and
// run spec; runRank then starts it.
func (a *Agent) prepareRank(c apiv1.PoolWorkerServiceClient, ref *pb.RankRef, l *pb.RankLease) (*rankRun, *runner.Spec, error) {
	k := rankKey{l.GetJobId(), l.GetAttempt(), l.GetRank()}
	spec := l.GetSpec()
	switch {
	case !validName(k.job):
		return nil, nil, fmt.Errorf("%w: job id %.80q", ErrLease, k.job)
	case k.attempt == 0 || l.GetWorldSize() == 0 || k.rank >= l.GetWorldSize():
		return nil, nil, fmt.Errorf("%w: attempt %d, rank %d of %d", ErrLease, k.attempt, k.rank, l.GetWorldSize())
	case spec == nil || spec.GetTotalSteps() < 1 || spec.GetCheckpointInterval() < 1:
		return nil, nil, fmt.Errorf("%w: spec without steps or checkpoint interval", ErrLease)
	}
	dir := a.rankDir(k)
	work := filepath.Join(dir, fmt.Sprintf("attempt-%d", k.attempt))
	if err := os.MkdirAll(work, 0o700); err != nil {
		return nil, nil, fmt.Errorf("worker: start rank: %w", err)
	}
	r := &rankRun{key: k, ref: ref, lease: proto.Clone(l).(*pb.RankLease), clk: a.clk, start: a.clk.Now(), ckptDir: filepath.Join(dir, "checkpoints"),
		// Until the rank reports, it is where its checkpoint puts it.
		step: l.GetResumeStep()}
	rs := runner.Spec{
		Dir:           work,
		CheckpointDir: r.ckptDir,
		Topology: runner.Topology{
			Rank: int(k.rank), WorldSize: int(l.GetWorldSize()),
			LocalRank: int(l.GetLocalRank()), LocalWorldSize: max(int(l.GetLocalWorldSize()), 1),
			GroupRank: int(l.GetGroupRank()), GroupWorldSize: max(int(l.GetGroupWorldSize()), 1),
			MasterAddr: l.GetMasterAddr(), MasterPort: int(l.GetMasterPort()),
		},
		RunID:           fmt.Sprintf("%s-%d", k.job, k.attempt),
		RestartCount:    int(k.attempt - 1),
		MaxRestarts:     int(spec.GetMaxRestarts()),
		Steps:           spec.GetTotalSteps(),
		CheckpointEvery: spec.GetCheckpointInterval(),
		OnLine:          r.onLine,
		MaxLine:         maxLineBytes,
	}
	switch p := spec.GetProgram().(type) {
	case *pb.PoolJobSpec_Builtin:
		r.builtin = true
		leasePath := filepath.Join(work, leaseFileName)
		raw, err := proto.Marshal(l)
		if err != nil {
			return nil, nil, fmt.Errorf("worker: start rank: %w", err)
		}
		if err := writeLeaseFile(leasePath, &leaseFile{Server: a.cfg.Server, CAPEM: a.cfg.CAPEM, Token: a.cfg.Token, Insecure: a.cfg.Insecure, WorkerID: ref.GetWorkerId(), DataRoot: a.cfg.DataRoot, Lease: raw}); err != nil {
			return nil, nil, err
		}
		rs.Command = append(append([]string{}, a.cfg.RankCommand...), "--lease", leasePath)
		if rs.Topology.MasterAddr == "" {
			rs.Topology.MasterAddr, rs.Topology.MasterPort = builtinMaster, builtinPort
		}
	case *pb.PoolJobSpec_Command:
		rs.Command = p.Command.GetArgv()
		rs.Env = p.Command.GetEnv()
		ctx, cancel := context.WithCancel(context.Background())
		store, err := remote.NewStore(ctx, c, ref, remote.Retry{Initial: 200 * time.Millisecond, Max: 10 * time.Second, Attempts: 12, Clock: a.clk})
		if err != nil {
			cancel()
			return nil, nil, fmt.Errorf("worker: start rank: %w", err)
		}
		r.store, r.cancel = store, cancel
	default:
		return nil, nil, fmt.Errorf("%w: spec names no program", ErrLease)
	}
	r.logs = newLogShipper(c, ref, a.clk, a.log)
	return r, &rs, nil
}

// runRank starts r (a command rank resuming first gets its checkpoint from
// the server), waits for it and says how it ended.
func (a *Agent) runRank(r *rankRun, rs *runner.Spec) *pb.RankExitedRequest {
	k := r.key
	if r.cancel != nil {
		defer r.cancel()
	}
	if r.builtin {
		// The rank removes its lease file once read; one that never
		// started must not leave the token behind.
		defer os.Remove(filepath.Join(rs.Dir, leaseFileName))
	}
	fail := func(err error) *pb.RankExitedRequest {
		a.log.Warn("rank did not start", "job", k.job, "attempt", k.attempt, "rank", k.rank, "err", err)
		r.logs.add("agent", "rank did not start: "+oneLine(err.Error()))
		r.logs.close()
		return &pb.RankExitedRequest{WorkerId: r.ref.GetWorkerId(), JobId: k.job, Attempt: k.attempt, Rank: k.rank, Error: oneLine(err.Error()), ExitCode: -1, Usage: r.usage(true)}
	}
	if !r.builtin {
		// The server's checkpoints are the job's: step directories an
		// earlier attempt left here must not be resumed or uploaded.
		if err := os.RemoveAll(r.ckptDir); err != nil {
			return fail(fmt.Errorf("worker: start rank: %w", err))
		}
		if err := os.MkdirAll(r.ckptDir, 0o700); err != nil {
			return fail(fmt.Errorf("worker: start rank: %w", err))
		}
	}
	if !r.builtin && r.lease.GetResumeStep() > 0 {
		path, err := r.materialize()
		if err != nil {
			return fail(err)
		}
		rs.ResumeFrom = path
	}
	r.mu.Lock()
	if r.stopAsked {
		r.mu.Unlock()
		r.logs.close()
		return &pb.RankExitedRequest{WorkerId: r.ref.GetWorkerId(), JobId: k.job, Attempt: k.attempt, Rank: k.rank, Stopped: true, ExitCode: -1, Usage: r.usage(true)}
	}
	proc, err := runner.Start(*rs)
	if err != nil {
		r.mu.Unlock()
		return fail(fmt.Errorf("worker: start rank: %w", err))
	}
	r.proc = proc
	r.mu.Unlock()
	opts := []meter.Option{meter.WithClock(a.clk)}
	if r.lease.GetSpec().GetPerRank().GetGpus() > 0 {
		// Machine-wide like the energy counters: a rank that holds no GPU
		// is not charged for the others'.
		opts = append(opts, meter.WithGPU(a.smi))
	}
	if m, err := meter.Start(proc.Cmd(), opts...); err != nil {
		a.log.Warn("rank not metered", "job", k.job, "rank", k.rank, "err", err)
	} else {
		r.mu.Lock()
		r.meter = m
		r.mu.Unlock()
	}
	if !r.builtin {
		r.watchDone = make(chan struct{})
		go r.watchCheckpoints(a.clk)
	}
	r.logs.add("agent", fmt.Sprintf("rank %d of %d started on worker %s (pid %d)", k.rank, r.lease.GetWorldSize(), r.ref.GetWorkerId(), proc.Pid()))
	return r.wait()
}

// materialize writes the checkpoint the server says a command rank resumes
// from as a step directory and returns its path.
func (r *rankRun) materialize() (string, error) {
	id, m, err := r.store.Latest()
	if err != nil {
		return "", fmt.Errorf("worker: resume from step %d: %w", r.lease.GetResumeStep(), err)
	}
	if m.Step != r.lease.GetResumeStep() {
		return "", fmt.Errorf("worker: resume: %w: the server's checkpoint %s is of step %d, the lease says %d", ErrLease, id, m.Step, r.lease.GetResumeStep())
	}
	path, err := cmdckpt.Materialize(r.store, id, r.ckptDir)
	if err != nil {
		return "", fmt.Errorf("worker: resume from step %d: %w", m.Step, err)
	}
	return path, nil
}

// watchCheckpoints uploads each new step-N directory of a command rank
// to the server, follows its progress by them, and stops it after the
// upload when a stop at the next checkpoint was asked for or the commit's
// answer said stop.
func (r *rankRun) watchCheckpoints(clk clock.Clock) {
	t := clk.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-r.watchDone:
			return
		case <-t.C():
		}
		uploaded, err := r.uploadNew()
		r.mu.Lock()
		stop := uploaded && (r.stopAtCkpt || r.store.StopRequested())
		proc := r.proc
		r.mu.Unlock()
		switch {
		case err != nil && remote.IsRefused(err):
			// The server no longer takes this attempt's checkpoints:
			// its work would be lost, so it ends now.
			r.setError("checkpoint refused by the server: " + oneLine(err.Error()))
			r.stopQuietly(proc)
		case err != nil:
			r.logs.add("agent", "checkpoint upload failed, will retry: "+oneLine(err.Error()))
		case stop:
			r.mu.Lock()
			r.stopAsked = true
			r.mu.Unlock()
			proc.Stop()
		}
	}
}

func (r *rankRun) setError(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.errLine == "" {
		r.errLine = msg
	}
}

func (r *rankRun) stopQuietly(proc *runner.Process) {
	if proc != nil {
		proc.Stop()
	}
}

// uploadNew uploads the newest committed step directory if it is newer
// than the last one uploaded, and reports whether it did.
func (r *rankRun) uploadNew() (bool, error) {
	step, path, err := stepdir.Latest(r.ckptDir)
	if err != nil {
		if errors.Is(err, stepdir.ErrNoCheckpoint) {
			return false, nil
		}
		return false, err
	}
	r.mu.Lock()
	last := r.uploaded
	r.mu.Unlock()
	if step <= last || step > r.lease.GetSpec().GetTotalSteps() {
		return false, nil
	}
	id, err := cmdckpt.Upload(r.store, r.key.job, step, path, checkpoint.Options{ChunkSize: remote.MaxBlobBytes})
	if err != nil {
		return false, fmt.Errorf("worker: upload step %d: %w", step, err)
	}
	r.mu.Lock()
	r.uploaded, r.step = step, max(r.step, step)
	r.mu.Unlock()
	r.logs.add("agent", fmt.Sprintf("checkpoint step %d uploaded as %s", step, id))
	return true, nil
}

// wait waits for the rank to end and says how it ended.
func (r *rankRun) wait() *pb.RankExitedRequest {
	res, err := r.proc.Wait()
	if r.watchDone != nil {
		close(r.watchDone)
		// The script may have committed its last step and exited between
		// two looks: a completed rank's last checkpoint is on the server.
		if _, uerr := r.uploadNew(); uerr != nil {
			r.setError("last checkpoint not uploaded: " + oneLine(uerr.Error()))
		}
	}
	u := r.usage(true)
	r.mu.Lock()
	asked, errLine, digest := r.stopAsked, r.errLine, r.digest
	r.mu.Unlock()
	ex := &pb.RankExitedRequest{JobId: r.key.job, Attempt: r.key.attempt, Rank: r.key.rank, ExitCode: int32(res.ExitCode), Usage: u, DataSha256: digest}
	var ee *runner.ExitError
	errors.As(err, &ee)
	switch {
	case err == nil && errLine == "":
		ex.Completed = true
	case r.builtin && ee != nil && ee.Signal == 0 && ee.Code == RankExitStopped:
		ex.Stopped = true
	case asked && errors.Is(err, runner.ErrStopped):
		ex.Stopped = true
	case errLine != "":
		ex.Error = errLine
	default:
		ex.Error = oneLine(err.Error() + lastLine(res.Tail))
	}
	if ee != nil && ee.Signal == syscall.SIGKILL && !ex.Stopped {
		ex.Error = oneLine(ex.Error + " (killed with SIGKILL: out of memory?)")
	}
	switch {
	case ex.Completed:
		r.logs.add("agent", "rank completed")
	case ex.Stopped:
		r.logs.add("agent", "rank stopped")
	default:
		r.logs.add("agent", "rank failed: "+ex.Error)
	}
	r.logs.close()
	ex.WorkerId = r.logs.ref.GetWorkerId()
	return ex
}

func lastLine(tail []byte) string {
	s := strings.TrimSpace(string(tail))
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	if s == "" {
		return ""
	}
	return ": " + s
}
