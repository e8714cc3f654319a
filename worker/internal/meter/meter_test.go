package meter

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/internal/clock"
	"github.com/fleetlearn/fleetlearn/worker/internal/detect"
)

func within(got, want, frac float64) bool { return math.Abs(got-want) <= frac*want }

func rusageSeconds(t *testing.T, j *job) float64 {
	t.Helper()
	ru, ok := j.cmd.ProcessState.SysUsage().(*syscall.Rusage)
	if !ok {
		t.Fatal("no rusage")
	}
	return tvSeconds(ru.Utime) + tvSeconds(ru.Stime)
}

// checkBurn meters a child that burns 1.5 CPU-seconds on two threads and
// compares the meter's running figure with the child's own /proc reading,
// and its final figure with the kernel's rusage of the child.
func checkBurn(t *testing.T, mode Mode, wantBackend ...string) {
	t.Helper()
	skipShort(t)
	j := startJob(t, "burn")
	m, err := Start(j.cmd, WithMode(mode), WithInterval(20*time.Millisecond))
	if errors.Is(err, ErrNoCgroup) {
		j.finish(t)
		t.Skipf("cgroup backend unavailable here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	self := float64(j.ticks(t)) / clockTicks
	live := m.Sample()
	if !within(live.CPUSeconds, self, 0.05) {
		t.Errorf("live CPU = %.3f s, the child's own /proc reading %.3f s", live.CPUSeconds, self)
	}
	if self < 1.45 {
		t.Errorf("the child reports %.3f s, it was to burn 1.5", self)
	}
	j.finish(t)
	u := m.Stop()
	ru := rusageSeconds(t, j)
	if !within(u.CPUSeconds, ru, 0.05) || !within(u.CPUSeconds, self, 0.05) {
		t.Errorf("final CPU = %.3f s, rusage %.3f s, the child's own reading %.3f s", u.CPUSeconds, ru, self)
	}
	ok := false
	for _, b := range wantBackend {
		ok = ok || u.Backend == b
	}
	if !ok {
		t.Errorf("backend = %q, want one of %q", u.Backend, wantBackend)
	}
	if u.PeakMemoryBytes == 0 {
		t.Error("no peak memory")
	}
	if u2 := m.Stop(); u2 != u || m.Sample() != u {
		t.Errorf("Stop again = %+v, want %+v", u2, u)
	}
	t.Logf("%+v", u)
}

func TestProcBackendCPU(t *testing.T) { checkBurn(t, Proc, BackendProc) }

func TestCgroupBackendCPU(t *testing.T) {
	checkBurn(t, Cgroup, BackendCgroup, BackendCgroupProc)
	ents, _ := filepath.Glob(filepath.Join(cgroupParentForTest(t), "fleetlearn-job-"+strconv.Itoa(os.Getpid())+"-*"))
	if len(ents) != 0 {
		t.Errorf("job cgroups left behind: %q", ents)
	}
}

// TestProcBackendTree: a grandchild's CPU counts, while it runs (found by
// the walk) and once its parent has reaped it (in the parent's cutime), even
// where no sample saw it alive.
func TestProcBackendTree(t *testing.T) {
	skipShort(t)
	for _, seenAlive := range []bool{true, false} {
		j := startJob(t, "tree")
		// A clock that never ticks: only the samples below are taken.
		m, err := Start(j.cmd, WithMode(Proc), WithClock(clock.NewFake(time.Unix(0, 0))))
		if err != nil {
			t.Fatal(err)
		}
		grand := float64(j.ticks(t)) / clockTicks
		if seenAlive {
			if live := m.Sample(); live.CPUSeconds < grand*0.95 {
				t.Errorf("live CPU = %.3f s, the grandchild alone reports %.3f s", live.CPUSeconds, grand)
			}
		}
		j.stdin.Close()
		own := float64(j.ticks(t)) / clockTicks
		after := m.Sample()
		if !within(after.CPUSeconds, grand+own, 0.05) {
			t.Errorf("seen alive %v: CPU after the grandchild's exit = %.3f s, want %.3f + %.3f s", seenAlive, after.CPUSeconds, grand, own)
		}
		j.finish(t)
		u := m.Stop()
		if ru := rusageSeconds(t, j); !within(u.CPUSeconds, ru, 0.05) {
			t.Errorf("final CPU = %.3f s, rusage (with the waited-for grandchild) %.3f s", u.CPUSeconds, ru)
		}
	}
}

// skipShort gates the tests that burn CPU-seconds on purpose.
func skipShort(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("burns 1.5 CPU-seconds in a child process; skipped in -short")
	}
}

// TestPeakMemory: a child that touches 100 MiB peaks at 100 MiB and more
// (its runtime too), well under 300 MB; seen live by the sampler and at
// the end through rusage.
func TestPeakMemory(t *testing.T) {
	for _, mode := range []Mode{Proc, Auto} {
		j := startJob(t, "alloc")
		m, err := Start(j.cmd, WithMode(mode))
		if err != nil {
			t.Fatal(err)
		}
		if l := j.line(t); l != "ready" {
			t.Fatalf("report %q", l)
		}
		live := m.Sample()
		j.finish(t)
		u := m.Stop()
		for _, v := range []uint64{live.PeakMemoryBytes, u.PeakMemoryBytes} {
			if v < 100<<20 || v >= 300e6 {
				t.Errorf("mode %d: peak memory = %d bytes (live %d), want in [100 MiB, 300 MB)", mode, v, live.PeakMemoryBytes)
			}
		}
	}
}

// TestTickerSamples: the sampler runs on the injected clock's ticks, and
// only on them.
func TestTickerSamples(t *testing.T) {
	fake := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	sampled := make(chan struct{}, 1)
	j := startJob(t, "alloc")
	m, err := Start(j.cmd, WithMode(Proc), WithClock(fake), WithInterval(time.Second),
		func(o *options) { o.onSample = func() { sampled <- struct{}{} } })
	if err != nil {
		t.Fatal(err)
	}
	j.line(t)
	for fake.Pending() == 0 {
		<-fake.Changed()
	}
	if d := fake.Deadlines(); len(d) != 1 || !d[0].Equal(fake.Now().Add(time.Second)) {
		t.Fatalf("deadlines %v, want one tick an interval from now", d)
	}
	select {
	case <-sampled:
		t.Fatal("sampled without a tick")
	default:
	}
	fake.Advance(time.Second)
	<-sampled
	m.mu.Lock()
	after := m.last.PeakMemoryBytes
	m.mu.Unlock()
	if after < 100<<20 {
		t.Errorf("after a tick the sampler saw %d bytes, want ≥ 100 MiB", after)
	}
	j.finish(t)
	m.Stop()
	if fake.Pending() != 0 {
		t.Error("the sampler's ticker outlived Stop")
	}
}

func cgroupParentForTest(t *testing.T) string {
	t.Helper()
	d, err := detect.CgroupDir("")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestStartErrors(t *testing.T) {
	j := startJob(t, "alloc")
	if _, err := Start(j.cmd, WithInterval(0)); err == nil {
		t.Error("a zero interval was accepted")
	}
	j.finish(t)
	if _, err := Start(j.cmd, WithMode(Proc)); err == nil {
		t.Error("a reaped command was accepted")
	}
}
