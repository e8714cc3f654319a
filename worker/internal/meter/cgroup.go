package meter

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fleetlearn/fleetlearn/internal/smallfile"
	"github.com/fleetlearn/fleetlearn/worker/internal/detect"
)

// jobSeq tells apart the cgroups of jobs whose pids were reused.
var jobSeq atomic.Uint64

// jobCgroup is the child cgroup one job runs in.
type jobCgroup struct {
	dir, parent string
	usec        uint64
	peak        uint64
	hasPeak     bool
}

// newJobCgroup creates a cgroup under parent (this process's own cgroup
// when "") and moves pid into it. The job's first process has only just
// been started, so the little it ran before the move is left to its rusage.
func newJobCgroup(parent string, pid int) (*jobCgroup, error) {
	if parent == "" {
		d, err := detect.CgroupDir("")
		if err != nil {
			return nil, fmt.Errorf("job cgroup: %w: %w", ErrNoCgroup, err)
		}
		parent = d
	}
	dir := filepath.Join(parent, fmt.Sprintf("fleetlearn-job-%d-%d-%d", os.Getpid(), pid, jobSeq.Add(1)))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("job cgroup: %w: %w", ErrNoCgroup, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		os.Remove(dir)
		return nil, fmt.Errorf("job cgroup: move %d into %s: %w: %w", pid, dir, ErrNoCgroup, err)
	}
	cg := &jobCgroup{dir: dir, parent: parent}
	if err := cg.readCPU(); err != nil {
		cg.remove()
		return nil, fmt.Errorf("job cgroup: %w: %w", ErrNoCgroup, err)
	}
	return cg, nil
}

func (c *jobCgroup) cpuSeconds() float64 { return float64(c.usec) / 1e6 }

func (c *jobCgroup) readCPU() error {
	b, err := smallfile.Read(filepath.Join(c.dir, "cpu.stat"), procFileLimit)
	if err != nil {
		return err
	}
	usec, err := parseCPUStat(b)
	if err != nil {
		return fmt.Errorf("%s: %w", filepath.Join(c.dir, "cpu.stat"), err)
	}
	c.usec = max(c.usec, usec)
	return nil
}

// sample reads the cgroup's counters; a read that fails keeps the last.
func (c *jobCgroup) sample() {
	_ = c.readCPU()
	// memory.peak exists only where the parent enables the memory
	// controller for its children (and since Linux 5.19).
	if b, err := smallfile.Read(filepath.Join(c.dir, "memory.peak"), procFileLimit); err == nil {
		if v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err == nil {
			c.peak, c.hasPeak = max(c.peak, v), true
		}
	}
}

// parseCPUStat returns usage_usec from a cgroup v2 cpu.stat.
func parseCPUStat(b []byte) (uint64, error) {
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parse cpu.stat: bad usage_usec %q", v)
			}
			return n, nil
		}
	}
	return 0, errors.New("parse cpu.stat: no usage_usec")
}

// remove deletes the cgroup. Processes of the job still in it go back to
// the parent first, since a populated cgroup cannot be removed; the
// kernel also lags a moment behind the exit of the last one, hence the
// few short retries.
func (c *jobCgroup) remove() {
	for i := range 50 {
		err := os.Remove(c.dir)
		if err == nil || errors.Is(err, os.ErrNotExist) || !errors.Is(err, syscall.EBUSY) {
			return
		}
		if b, err := smallfile.Read(filepath.Join(c.dir, "cgroup.procs"), 1<<20); err == nil {
			for pid := range bytes.FieldsSeq(b) {
				_ = os.WriteFile(filepath.Join(c.parent, "cgroup.procs"), pid, 0)
			}
		}
		// Not behaviour: the kernel's own settling, bounded at half a second.
		time.Sleep(time.Duration(i+1) * 400 * time.Microsecond)
	}
}
