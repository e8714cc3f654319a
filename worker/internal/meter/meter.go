// Package meter measures what one job costs: the CPU-seconds and the peak
// memory of its process tree, and, where the machine exposes it, the
// energy drawn while it ran.
//
// Two backends count CPU. Where the agent may create a cgroup under its own
// cgroup v2 cgroup, the job's first process is moved into a new child
// cgroup right after it starts, and the kernel's own account (cpu.stat
// usage_usec, memory.peak where the memory controller is enabled there)
// covers every descendant, however short-lived or orphaned. Elsewhere a
// sampler walks the process tree in /proc at an interval. Both are lower
// bounds of the truth, and the final figure is the larger of the backend's
// and the exact rusage of the job's first process, which the kernel hands
// its parent when it is waited for and which includes every descendant that
// was itself waited for.
//
// Energy is machine-wide: RAPL counters and GPU power cover every process on
// the machine, so a job's energy is only its own where it ran alone.
package meter

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fleetlearn/fleetlearn/internal/clock"
)

// Usage is what a job used.
type Usage struct {
	CPUSeconds      float64
	PeakMemoryBytes uint64
	// EnergyJoules is valid where EnergySource is not EnergyUnavailable.
	EnergyJoules float64
	// EnergySource names the counters summed ("rapl", "nvidia-smi",
	// "rapl+nvidia-smi"), all machine-wide, or is EnergyUnavailable.
	EnergySource string
	// GPUBusySeconds is the GPUs' busy time while the job ran: their
	// utilization integrated over time and summed over GPUs, machine-wide
	// like the energy; valid where GPUMetered.
	GPUBusySeconds float64
	GPUMetered     bool
	// Backend is where the CPU and memory figures came from: BackendCgroup,
	// BackendCgroupProc (CPU from the cgroup, memory from /proc because the
	// cgroup has no memory controller) or BackendProc.
	Backend string
}

// Backend names.
const (
	BackendCgroup     = "cgroup"
	BackendCgroupProc = "cgroup+proc"
	BackendProc       = "proc"
)

// EnergyUnavailable is Usage.EnergySource where the machine exposes no
// energy counter to this process.
const EnergyUnavailable = "unavailable"

// Mode chooses the backend.
type Mode int

const (
	// Auto uses a cgroup where one can be created, /proc otherwise.
	Auto Mode = iota
	// Cgroup insists on a cgroup: Start fails where none can be created.
	Cgroup
	// Proc uses /proc alone.
	Proc
)

// ErrNoCgroup reports that no child cgroup could be created or joined.
var ErrNoCgroup = errors.New("no writable cgroup v2 delegation")

// DefaultInterval is how often the /proc sampler and the energy counters
// are read unless WithInterval says otherwise: often enough that a job of a
// few seconds is seen, rarely enough to cost nothing.
const DefaultInterval = 250 * time.Millisecond

type options struct {
	interval  time.Duration
	clk       clock.Clock
	mode      Mode
	procRoot  string
	powercap  string
	gpuSMI    string
	cgroupDir string
	onSample  func() // tests: called after each ticker sample
}

// Option tunes Start.
type Option func(*options)

// WithInterval sets the sampling interval (d > 0).
func WithInterval(d time.Duration) Option { return func(o *options) { o.interval = d } }

// WithClock sets the clock that drives the sampler.
func WithClock(c clock.Clock) Option { return func(o *options) { o.clk = c } }

// WithMode chooses the backend.
func WithMode(m Mode) Option { return func(o *options) { o.mode = m } }

// WithPowercap reads RAPL zones under dir instead of
// /sys/class/powercap; "" turns RAPL off.
func WithPowercap(dir string) Option { return func(o *options) { o.powercap = dir } }

// WithGPU samples the GPUs' power draw and utilization through the
// nvidia-smi at smi (GPUQuery) at each interval and integrates both, into
// energy and GPU busy time; "" (the default) leaves GPUs out, since each
// sample runs a process.
func WithGPU(smi string) Option { return func(o *options) { o.gpuSMI = smi } }

// WithCgroupParent creates the job's cgroup under dir instead of under this
// process's own cgroup.
func WithCgroupParent(dir string) Option { return func(o *options) { o.cgroupDir = dir } }

// Meter meters one started command.
type Meter struct {
	cmd  *exec.Cmd
	o    options
	tree *procTree
	cg   *jobCgroup // nil for the /proc backend
	en   *energy

	mu      sync.Mutex
	last    Usage // the latest sample
	stopped bool
	final   Usage

	done chan struct{}
	wg   sync.WaitGroup
}

// Start meters cmd, which must have been started (cmd.Start) and not yet
// waited for. Call Stop after cmd.Wait for the exact figures.
func Start(cmd *exec.Cmd, opts ...Option) (*Meter, error) {
	o := options{interval: DefaultInterval, procRoot: "/proc", powercap: "/sys/class/powercap"}
	for _, f := range opts {
		f(&o)
	}
	if o.interval <= 0 {
		return nil, fmt.Errorf("meter start: interval %v is not positive", o.interval)
	}
	o.clk = clock.Or(o.clk)
	if cmd.Process == nil {
		return nil, errors.New("meter start: command not started")
	}
	pid := cmd.Process.Pid
	m := &Meter{cmd: cmd, o: o, done: make(chan struct{})}
	tree, err := newProcTree(o.procRoot, pid)
	if err != nil {
		return nil, fmt.Errorf("meter start: %w", err)
	}
	m.tree = tree
	if o.mode != Proc {
		cg, err := newJobCgroup(o.cgroupDir, pid)
		if err != nil && o.mode == Cgroup {
			return nil, fmt.Errorf("meter start: %w", err)
		}
		m.cg = cg // nil on failure in Auto: /proc it is
	}
	m.en = newEnergy(o.powercap, o.gpuSMI, o.clk)
	m.sampleLocked()
	m.wg.Add(1)
	go m.run()
	return m, nil
}

func (m *Meter) run() {
	defer m.wg.Done()
	t := m.o.clk.NewTicker(m.o.interval)
	defer t.Stop()
	for {
		select {
		case <-m.done:
			return
		case <-t.C():
			m.mu.Lock()
			m.sampleLocked()
			m.mu.Unlock()
			if m.o.onSample != nil {
				m.o.onSample()
			}
		}
	}
}

// sampleLocked reads every source once and keeps the running figures.
func (m *Meter) sampleLocked() Usage {
	m.tree.sample()
	u := Usage{Backend: BackendProc, CPUSeconds: m.tree.cpuSeconds(), PeakMemoryBytes: m.tree.peak}
	if m.cg != nil {
		m.cg.sample()
		u.CPUSeconds = m.cg.cpuSeconds()
		u.Backend = BackendCgroupProc
		if m.cg.hasPeak {
			u.PeakMemoryBytes = max(m.cg.peak, u.PeakMemoryBytes)
			u.Backend = BackendCgroup
		}
	}
	u.EnergyJoules, u.EnergySource = m.en.sample()
	u.GPUBusySeconds, u.GPUMetered = m.en.gpuSeconds()
	m.last = u
	return u
}

// Sample reads the job's usage so far.
func (m *Meter) Sample() Usage {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped {
		return m.final
	}
	return m.sampleLocked()
}

// Stop ends metering and returns the job's usage. After cmd.Wait it adds
// the command's final rusage; before it, the figures are those of the last
// sample. The job's cgroup is removed: processes of the job still alive
// (which the runner should have killed) go back to the parent cgroup.
// Stop is idempotent.
func (m *Meter) Stop() Usage {
	m.mu.Lock()
	if m.stopped {
		defer m.mu.Unlock()
		return m.final
	}
	m.stopped = true
	m.mu.Unlock()
	close(m.done)
	m.wg.Wait()

	m.mu.Lock()
	defer m.mu.Unlock()
	u := m.sampleLocked()
	if ps := m.cmd.ProcessState; ps != nil {
		if ru, ok := ps.SysUsage().(*syscall.Rusage); ok && ru != nil {
			cpu := tvSeconds(ru.Utime) + tvSeconds(ru.Stime)
			u.CPUSeconds = max(u.CPUSeconds, cpu)
			// Linux reports ru_maxrss in KiB.
			u.PeakMemoryBytes = max(u.PeakMemoryBytes, uint64(max(ru.Maxrss, 0))*1024)
		}
	}
	if m.cg != nil {
		m.cg.remove()
	}
	m.final = u
	return u
}

func tvSeconds(tv syscall.Timeval) float64 {
	return float64(tv.Sec) + float64(tv.Usec)/1e6
}

// joinSources names the energy sources in use.
func joinSources(s []string) string {
	if len(s) == 0 {
		return EnergyUnavailable
	}
	return strings.Join(s, "+")
}
