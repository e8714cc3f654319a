package runner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Defaults for the zero values in Spec.
const (
	DefaultTailBytes = 64 << 10
	DefaultMaxLine   = 16 << 10
	DefaultGrace     = 10 * time.Second
	// waitDelay bounds how long Wait waits for output pipes held open by a
	// process that left the group (setsid) after the group is gone.
	waitDelay = 5 * time.Second
)

// Topology is a rank's place in the job, as torchrun describes it.
type Topology struct {
	Rank           int // global rank, 0..WorldSize-1
	WorldSize      int
	LocalRank      int // rank on this node, 0..LocalWorldSize-1
	LocalWorldSize int
	GroupRank      int // node rank, 0..GroupWorldSize-1
	GroupWorldSize int
	MasterAddr     string // rendezvous host of rank 0
	MasterPort     int
}

func (t Topology) validate() error {
	switch {
	case t.WorldSize < 1 || t.Rank < 0 || t.Rank >= t.WorldSize:
		return fmt.Errorf("rank %d of world size %d", t.Rank, t.WorldSize)
	case t.LocalWorldSize < 1 || t.LocalWorldSize > t.WorldSize || t.LocalRank < 0 || t.LocalRank >= t.LocalWorldSize:
		return fmt.Errorf("local rank %d of local world size %d (world %d)", t.LocalRank, t.LocalWorldSize, t.WorldSize)
	case t.GroupWorldSize < 1 || t.GroupRank < 0 || t.GroupRank >= t.GroupWorldSize:
		return fmt.Errorf("group rank %d of %d nodes", t.GroupRank, t.GroupWorldSize)
	case t.MasterAddr == "" || strings.ContainsAny(t.MasterAddr, " \t\r\n\x00"):
		return fmt.Errorf("master address %q", t.MasterAddr)
	case t.MasterPort < 1 || t.MasterPort > 65535:
		return fmt.Errorf("master port %d", t.MasterPort)
	}
	return nil
}

// Spec describes one rank of a job.
type Spec struct {
	// Command is the program and its arguments, e.g. {"python3", "train.py"};
	// a bare name is looked up in the worker's PATH.
	Command []string
	// Dir is the rank's working directory (absolute); created if missing.
	Dir string
	// Env is the job's declared environment, validated by Start.
	Env map[string]string

	Topology     Topology
	RunID        string // TORCHELASTIC_RUN_ID; "none" when empty, as torchrun
	RestartCount int    // TORCHELASTIC_RESTART_COUNT: how many times this rank was restarted
	MaxRestarts  int    // TORCHELASTIC_MAX_RESTARTS

	// CheckpointDir (absolute) is FLEETLEARN_CHECKPOINT_DIR; created if
	// missing. ResumeFrom is FLEETLEARN_RESUME_FROM, empty on a fresh start;
	// it must be an existing directory, normally from LatestCheckpoint.
	CheckpointDir   string
	ResumeFrom      string
	Steps           int64 // FLEETLEARN_STEPS
	CheckpointEvery int64 // FLEETLEARN_CHECKPOINT_EVERY

	// TailBytes is how much of the combined output Result keeps;
	// DefaultTailBytes when 0.
	TailBytes int
	// OnLine, when set, receives each output line as it arrives, without
	// its newline; lines longer than MaxLine bytes arrive in pieces. Calls
	// are serialised and block the stream, so a slow callback slows the
	// script rather than growing a buffer.
	OnLine  func(Stream, string)
	MaxLine int // DefaultMaxLine when 0
	// Grace is how long a stopped rank has between SIGTERM and SIGKILL;
	// DefaultGrace when 0.
	Grace time.Duration
}

func (s *Spec) validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("runner: spec: "+format+": %w", append(a, ErrInvalidSpec)...)
	}
	if len(s.Command) == 0 || s.Command[0] == "" {
		return bad("no command")
	}
	for i, a := range s.Command {
		if strings.ContainsRune(a, 0) {
			return bad("argument %d contains NUL", i)
		}
	}
	for _, d := range []struct{ name, path string }{{"dir", s.Dir}, {"checkpoint dir", s.CheckpointDir}} {
		if !filepath.IsAbs(d.path) || strings.ContainsRune(d.path, 0) {
			return bad("%s %q is not an absolute path", d.name, d.path)
		}
	}
	if s.ResumeFrom != "" {
		if !filepath.IsAbs(s.ResumeFrom) {
			return bad("resume from %q is not an absolute path", s.ResumeFrom)
		}
		if fi, err := os.Stat(s.ResumeFrom); err != nil || !fi.IsDir() {
			return bad("resume from %q is not a directory", s.ResumeFrom)
		}
	}
	if err := s.Topology.validate(); err != nil {
		return bad("topology: %v", err)
	}
	if s.RestartCount < 0 || s.MaxRestarts < 0 || s.Steps < 0 || s.CheckpointEvery < 0 {
		return bad("negative restart count, steps or checkpoint interval")
	}
	if s.TailBytes < 0 || s.MaxLine < 0 || s.Grace < 0 {
		return bad("negative tail, line or grace bound")
	}
	return validateJobEnv(s.Env)
}

// Result is what remains of a finished rank.
type Result struct {
	ExitCode  int // -1 when killed by a signal
	Tail      []byte
	LogBytes  int64 // all output bytes, of which Tail is the last TailBytes
	StartedAt time.Time
	Duration  time.Duration
}

// Process is a running rank. Its command leads a process group of its own,
// so Stop and Kill reach everything it spawned (data loader workers, shells)
// unless a descendant deliberately moves itself out with setsid.
type Process struct {
	cmd     *exec.Cmd
	pgid    int
	grace   time.Duration
	sink    *logSink
	outs    [2]*streamWriter
	started time.Time

	stopOnce sync.Once
	stopReq  chan struct{}       // closed by Stop
	sigReq   chan syscall.Signal // Signal's requests, served while the leader is unreaped
	killReq  chan struct{}       // closed by Kill
	killOnce sync.Once

	exited chan struct{} // closed once the leader has exited, before reaping
	done   chan struct{} // closed when Wait's result is ready
	res    Result
	err    error

	mu      sync.Mutex
	stopped bool // the runner signalled the group
}

// Start validates s and starts the command.
func Start(s Spec) (*Process, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	for _, d := range []string{s.Dir, s.CheckpointDir} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return nil, fmt.Errorf("runner: start: %v: %w", err, ErrStart)
		}
	}
	tail, maxLine, grace := s.TailBytes, s.MaxLine, s.Grace
	if tail == 0 {
		tail = DefaultTailBytes
	}
	if maxLine == 0 {
		maxLine = DefaultMaxLine
	}
	if grace == 0 {
		grace = DefaultGrace
	}
	sink := newLogSink(tail, maxLine, s.OnLine)
	p := &Process{
		grace:   grace,
		sink:    sink,
		outs:    [2]*streamWriter{{sink: sink, stream: Stdout}, {sink: sink, stream: Stderr}},
		stopReq: make(chan struct{}),
		killReq: make(chan struct{}),
		sigReq:  make(chan syscall.Signal),
		exited:  make(chan struct{}),
		done:    make(chan struct{}),
	}
	cmd := exec.Command(s.Command[0], s.Command[1:]...)
	cmd.Dir = s.Dir
	cmd.Env = buildEnv(&s)
	cmd.Stdin = nil // /dev/null: a rank is not interactive
	cmd.Stdout = p.outs[0]
	cmd.Stderr = p.outs[1]
	// Pdeathsig ties the rank's life to the agent's: a worker agent killed
	// with SIGKILL cannot stop its ranks, and an orphaned rank would go on
	// training for an attempt the server has already given to others.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = waitDelay
	p.started = time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("runner: start %s: %v: %w", s.Command[0], err, ErrStart)
	}
	p.cmd = cmd
	p.pgid = cmd.Process.Pid // Setpgid with Pgid 0: the leader's pid names the group
	go p.supervise()
	return p, nil
}

// supervise escalates stop requests and reaps the rank. It signals the group
// only while the leader is unreaped: a zombie leader keeps the group id from
// being reused, so a late signal cannot hit an unrelated process.
func (p *Process) supervise() {
	waitErr := make(chan error, 1)
	go func() { waitErr <- waitExited(p.cmd.Process.Pid); close(p.exited) }()

	var escalate <-chan time.Time
	stopReq, killReq := p.stopReq, p.killReq
loop:
	for {
		select {
		case <-stopReq:
			stopReq = nil
			p.signal(syscall.SIGTERM)
			t := time.NewTimer(p.grace)
			defer t.Stop()
			escalate = t.C
		case <-escalate:
			escalate = nil
			p.signal(syscall.SIGKILL)
		case <-killReq:
			killReq = nil
			p.signal(syscall.SIGKILL)
		case sig := <-p.sigReq:
			_ = syscall.Kill(-p.pgid, sig)
		case <-p.exited:
			break loop
		}
	}
	<-waitErr
	// The rank is over once its leader exits; whatever it left running in
	// its group (background children, loader workers) goes with it.
	_ = syscall.Kill(-p.pgid, syscall.SIGKILL)

	err := p.cmd.Wait()
	p.outs[0].flush()
	p.outs[1].flush()
	p.res.StartedAt = p.started
	p.res.Duration = time.Since(p.started)
	p.res.Tail, p.res.LogBytes = p.sink.tail()
	p.res.ExitCode = p.cmd.ProcessState.ExitCode()
	p.err = p.exitErr(err)
	close(p.done)
}

func (p *Process) signal(sig syscall.Signal) {
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
	_ = syscall.Kill(-p.pgid, sig)
}

func (p *Process) exitErr(err error) error {
	p.mu.Lock()
	stopped := p.stopped
	p.mu.Unlock()
	st := p.cmd.ProcessState
	ws, _ := st.Sys().(syscall.WaitStatus)
	switch {
	case err == nil && !stopped:
		return nil
	case err == nil:
		// Exited 0 after a stop request: the script honoured SIGTERM, but
		// the job did not finish on its own.
		return fmt.Errorf("runner: %w", &ExitError{Code: 0, Stopped: true})
	case ws.Signaled():
		return fmt.Errorf("runner: %w", &ExitError{Code: -1, Signal: ws.Signal(), Stopped: stopped})
	case st.Exited():
		var ee *exec.ExitError
		if errors.As(err, &ee) || errors.Is(err, exec.ErrWaitDelay) {
			return fmt.Errorf("runner: %w", &ExitError{Code: st.ExitCode(), Stopped: stopped})
		}
	}
	return fmt.Errorf("runner: wait: %v: %w", err, ErrExit)
}

// Pid is the leader's process id, which is also the group id.
func (p *Process) Pid() int { return p.pgid }

// Cmd is the started command, for meter.Start. Its ProcessState may be read
// once Wait has returned.
func (p *Process) Cmd() *exec.Cmd { return p.cmd }

// Signal sends sig to the rank's process group, as a request the rank
// interprets (the pool agent's SIGUSR1: stop at the next checkpoint); unlike
// Stop it does not mark the rank as stopped by the runner. It does nothing
// once the leader has exited, so a late signal cannot reach a reused group.
func (p *Process) Signal(sig syscall.Signal) {
	select {
	case p.sigReq <- sig:
	case <-p.exited:
	}
}

// Stop sends SIGTERM to the rank's process group and SIGKILL after the grace
// period, as torchrun does, so a script can write a last checkpoint. It does
// not wait; call Wait.
func (p *Process) Stop() { p.stopOnce.Do(func() { close(p.stopReq) }) }

// Kill sends SIGKILL to the rank's process group at once.
func (p *Process) Kill() { p.killOnce.Do(func() { close(p.killReq) }) }

// Wait blocks until the rank and its process group are gone. The error is nil
// for a clean exit on its own, else it wraps ErrExit, ErrSignaled or
// ErrStopped (with an *ExitError for details).
func (p *Process) Wait() (Result, error) {
	<-p.done
	return p.res, p.err
}

// Run starts s and waits for it; cancelling ctx stops the rank (SIGTERM,
// then SIGKILL after the grace period) and the error then wraps both
// ErrStopped's ExitError and ctx's error.
func Run(ctx context.Context, s Spec) (Result, error) {
	p, err := Start(s)
	if err != nil {
		return Result{}, err
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		p.Stop()
	}
	res, err := p.Wait()
	if err != nil && errors.Is(err, ErrStopped) && ctx.Err() != nil {
		err = fmt.Errorf("%w (%w)", err, context.Cause(ctx))
	}
	return res, err
}
