package meter

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/internal/clock"
)

func TestParseStat(t *testing.T) {
	// A command name with spaces and parentheses, as a job may choose.
	b := []byte("4242 (my (evil) job) S 4241 4242 4242 0 -1 4194560 100 0 0 0 150 30 7 3 20 0 3 0 987654 1000 200 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n")
	st, err := parseStat(b)
	if err != nil {
		t.Fatal(err)
	}
	if st.ppid != 4241 || st.ticks != 150+30+7+3 || st.start != 987654 {
		t.Errorf("parseStat = %+v", st)
	}
	for _, bad := range []string{"", "4242 no parens S 1", "1 (x) S 1 2 3", "1 (x) S one 1 1 0 -1 0 0 0 0 0 1 1 1 1 20 0 1 0 5 0",
		"1 (x) S 1 1 1 0 -1 0 0 0 0 0 1 -1 1 1 20 0 1 0 5 0 0"} {
		if _, err := parseStat([]byte(bad)); err == nil {
			t.Errorf("parseStat(%q) accepted", bad)
		}
	}
	rss, hwm := parseStatusMemory([]byte("Name:\tx\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\nVmSwap: 0 kB\n"))
	if rss != 100<<20 || hwm != 200<<20 {
		t.Errorf("parseStatusMemory = %d, %d", rss, hwm)
	}
	if rss, hwm := parseStatusMemory([]byte("VmHWM: lots kB\nVmRSS: 99999999999999999999 kB\nVmRSS 1 kB")); rss != 0 || hwm != 0 {
		t.Errorf("garbage status = %d, %d", rss, hwm)
	}
	if v, err := parseCPUStat([]byte("usage_usec 1500000\nuser_usec 1400000\n")); err != nil || v != 1500000 {
		t.Errorf("parseCPUStat = %d, %v", v, err)
	}
	for _, bad := range []string{"", "user_usec 5\n", "usage_usec -1\n", "usage_usec lots\n"} {
		if _, err := parseCPUStat([]byte(bad)); err == nil {
			t.Errorf("parseCPUStat(%q) accepted", bad)
		}
	}
}

// TestWalkByPPid: the fallback for kernels without task/*/children finds
// the same tree.
func TestWalkByPPid(t *testing.T) {
	skipShort(t)
	j := startJob(t, "tree")
	defer j.finish(t)
	tr, err := newProcTree("/proc", j.cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	j.ticks(t) // the grandchild is up and has burnt
	if tr.scanPPid {
		t.Skip("this kernel has no /proc/<pid>/task/<tid>/children")
	}
	pids := func() []int {
		var p []int
		for k := range tr.walk() {
			p = append(p, k.pid)
		}
		slices.Sort(p)
		return p
	}
	byChildren := pids()
	tr.scanPPid = true
	byPPid := pids()
	if len(byChildren) != 2 || !slices.Equal(byChildren, byPPid) {
		t.Errorf("tree by children files %v, by ppid %v; want the child and the grandchild", byChildren, byPPid)
	}
}

func TestWrapDelta(t *testing.T) {
	for _, c := range []struct{ last, now, max, want uint64 }{
		{100, 250, 1000, 150},
		{900, 50, 1000, 150},
		{2000, 50, 1000, 50},
		{0, 0, 1000, 0},
	} {
		if got := wrapDelta(c.last, c.now, c.max); got != c.want {
			t.Errorf("wrapDelta(%d, %d, %d) = %d, want %d", c.last, c.now, c.max, got, c.want)
		}
	}
}

// TestRAPL reads a powercap tree whose package counter wraps between
// samples; the sub-zone is not counted twice.
func TestRAPL(t *testing.T) {
	dir := t.TempDir()
	write := func(rel, v string) {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("intel-rapl:0/max_energy_range_uj", "262143328850")
	write("intel-rapl:0/energy_uj", "262143000000")
	write("intel-rapl:0/intel-rapl:0:0/max_energy_range_uj", "262143328850")
	write("intel-rapl:0/intel-rapl:0:0/energy_uj", "5")
	write("intel-rapl:0:0/max_energy_range_uj", "262143328850")
	write("intel-rapl:0:0/energy_uj", "5")
	write("intel-rapl:1/max_energy_range_uj", "1000")
	write("intel-rapl:1/energy_uj", "garbage")
	e := newEnergy(dir, "", clock.Real())
	if len(e.zones) != 1 {
		t.Fatalf("zones = %d, want the one readable package", len(e.zones))
	}
	write("intel-rapl:0/energy_uj", "1000000") // wrapped
	j, src := e.sample()
	if want := (262143328850 - 262143000000 + 1000000) / 1e6; src != "rapl" || !within(j, want, 1e-9) {
		t.Errorf("energy = %v J from %q, want %v J from rapl", j, src, want)
	}
	write("intel-rapl:0:0/energy_uj", "99999999")
	write("intel-rapl:0/energy_uj", "3000000")
	if j, _ := e.sample(); !within(j, (262143328850-262143000000+3000000)/1e6, 1e-9) {
		t.Errorf("energy after a second sample = %v J", j)
	}
	if _, src := newEnergy(t.TempDir(), "", clock.Real()).sample(); src != EnergyUnavailable {
		t.Errorf("no zones: source %q", src)
	}
}

// TestGPUPower integrates nvidia-smi's power.draw and utilization.gpu over
// the injected clock.
func TestGPUPower(t *testing.T) {
	dir := t.TempDir()
	watts := filepath.Join(dir, "watts")
	smi := filepath.Join(dir, "nvidia-smi")
	if err := os.WriteFile(smi, []byte("#!/bin/sh\ncat '"+watts+"'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	set := func(v string) {
		if err := os.WriteFile(watts, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	set("100.00, 100\n 50.00, 0\n")
	fake := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	e := newEnergy("", smi, fake)
	fake.Advance(2 * time.Second)
	set("200.00, 50\n 50.00, 50\n")
	j, src := e.sample()
	if src != "nvidia-smi" || !within(j, (150+250)/2*2, 1e-9) {
		t.Errorf("energy = %v J from %q, want 400 J from nvidia-smi", j, src)
	}
	// One busy GPU, then two half busy: (1 + 1) / 2 × 2 s.
	if busy, ok := e.gpuSeconds(); !ok || !within(busy, 2, 1e-9) {
		t.Errorf("GPU busy time = %v (%v), want 2 GPU-seconds", busy, ok)
	}
	set("[N/A], [N/A]\n")
	fake.Advance(time.Second)
	if j2, _ := e.sample(); j2 != j {
		t.Errorf("an unreadable power sample changed the energy: %v → %v", j, j2)
	}
	for _, bad := range []string{"", "[N/A]", "-3, 5", "1e9, 5", "5, 101", "5, -1", "5", "5, [N/A]", strings.Repeat("9", 400)} {
		if _, err := parseGPUReading([]byte(bad)); err == nil || len(err.Error()) > 100 {
			t.Errorf("parseGPUReading(%.20q) = %v", bad, err)
		}
	}
	if g, err := parseGPUReading([]byte("71.23, 87\n" + strconv.Itoa(29) + ", 3\n")); err != nil || !within(g.watts, 100.23, 1e-9) || !within(g.busy, 0.9, 1e-9) {
		t.Errorf("parseGPUReading = %+v, %v", g, err)
	}
}
