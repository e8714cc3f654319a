package detect

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

func fixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseMeminfo(t *testing.T) {
	got, err := ParseMeminfo(fixture(t, "meminfo"))
	if err != nil || got != 24683584*1024 {
		t.Fatalf("ParseMeminfo = %d, %v; want %d", got, err, 24683584*1024)
	}
	for name, want := range map[string]string{
		"meminfo-garbage": "bad MemTotal",
		"meminfo-nototal": "no MemTotal line",
		"meminfo-badunit": "malformed MemTotal",
	} {
		if _, err := ParseMeminfo(fixture(t, name)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want one saying %q", name, err, want)
		}
	}
}

func TestParseCgroupFiles(t *testing.T) {
	for in, want := range map[string]float64{"max 100000\n": 0, "250000 100000\n": 2.5, "50000": 0.5, "max": 0} {
		if got, err := ParseCPUMax([]byte(in)); err != nil || got != want {
			t.Errorf("ParseCPUMax(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0 100000", "-5 100000", "100 0", "100 100 100", "lots 100000", strings.Repeat("9", 300)} {
		if got, err := ParseCPUMax([]byte(in)); err == nil {
			t.Errorf("ParseCPUMax(%.20q) = %v, want an error", in, got)
		} else if len(err.Error()) > 200 {
			t.Errorf("ParseCPUMax(%.20q): error of %d bytes echoes the input", in, len(err.Error()))
		}
	}
	for in, want := range map[string]uint64{"max\n": 0, "17179869184\n": 16 << 30} {
		if got, err := ParseMemoryMax([]byte(in)); err != nil || got != want {
			t.Errorf("ParseMemoryMax(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-1", "16G", "\x00\x01", strings.Repeat("x", 1000)} {
		if _, err := ParseMemoryMax([]byte(in)); err == nil {
			t.Errorf("ParseMemoryMax(%.20q): want an error", in)
		} else if len(err.Error()) > 200 {
			t.Errorf("ParseMemoryMax(%.20q): error of %d bytes echoes the input", in, len(err.Error()))
		}
	}
	if p, err := ParseProcCgroup([]byte("12:memory:/x\n0::/a/b (deleted)\n")); err != nil || p != "/a/b" {
		t.Errorf("ParseProcCgroup = %q, %v", p, err)
	}
	if _, err := ParseProcCgroup([]byte("4:memory:/x\n1:cpu:/\n")); !errors.Is(err, ErrNoCgroup2) {
		t.Errorf("ParseProcCgroup on cgroup v1 only: %v, want ErrNoCgroup2", err)
	}
	if _, err := ParseProcCgroup([]byte("0::relative\n")); err == nil {
		t.Error("ParseProcCgroup accepted a relative path")
	}
	mnt, root, err := ParseCgroup2Mount([]byte(`41 31 0:38 /docker/abc /sys/fs/cgroup\040v2 rw,relatime - cgroup2 cgroup2 rw` + "\n"))
	if err != nil || mnt != "/sys/fs/cgroup v2" || root != "/docker/abc" {
		t.Errorf("ParseCgroup2Mount = %q, %q, %v", mnt, root, err)
	}
	if _, _, err := ParseCgroup2Mount([]byte("garbage\n - \n1 2 3\n")); !errors.Is(err, ErrNoCgroup2) {
		t.Errorf("ParseCgroup2Mount on garbage: %v", err)
	}
}

// smiScript writes an executable that stands in for nvidia-smi on a
// machine without one: a real program whose output the test chooses.
func smiScript(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "nvidia-smi")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestDetectFixtureTree reads a whole fixture machine: a systemd service
// cgroup whose own cpu.max is the tightest and whose slice's memory.max is.
func TestDetectFixtureTree(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("testdata", "root"))
	if err != nil {
		t.Fatal(err)
	}
	csv, err := filepath.Abs(filepath.Join("testdata", "nvidia-smi", "two-h200.csv"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := Detect(context.Background(), Options{Root: root, NvidiaSMI: smiScript(t, "cat '"+csv+"'")})
	if err != nil {
		t.Fatal(err)
	}
	if r.CPUQuota != 2.5 {
		t.Errorf("CPUQuota = %v, want 2.5 (the service's own cpu.max)", r.CPUQuota)
	}
	if r.MemoryBytes != 16<<30 {
		t.Errorf("MemoryBytes = %d, want 16 GiB (the slice's memory.max under the 62.5 GiB MemTotal)", r.MemoryBytes)
	}
	if len(r.GPUs) != 2 || r.GPUs[1].Index != 1 || r.GPUs[0].MemoryBytes != 143771<<20 || r.GPUError != nil {
		t.Errorf("GPUs = %+v, %v", r.GPUs, r.GPUError)
	}
	if want := min(float64(r.CPUs), 2.5); r.EffectiveCPUs() != want {
		t.Errorf("EffectiveCPUs = %v, want %v", r.EffectiveCPUs(), want)
	}
	dir, err := CgroupDir(root)
	if err != nil || dir != filepath.Join(root, "sys/fs/cgroup/system.slice/fleetlearn-worker.service") {
		t.Errorf("CgroupDir = %q, %v", dir, err)
	}
}

func TestParseNvidiaSMI(t *testing.T) {
	g, err := ParseNvidiaSMI(fixture(t, "nvidia-smi/two-h200.csv"))
	if err != nil {
		t.Fatal(err)
	}
	want := GPU{Index: 1, UUID: "GPU-9e8d7c6b-5a4f-4e3d-8c2b-1a0f9e8d7c6b", Name: "NVIDIA H200", MemoryBytes: 143771 << 20}
	if len(g) != 2 || g[1] != want {
		t.Fatalf("ParseNvidiaSMI = %+v", g)
	}
	g, err = ParseNvidiaSMI(fixture(t, "nvidia-smi/comma-name.csv"))
	if err != nil || len(g) != 1 || g[0].Name != "Tesla T4, rev A" || g[0].MemoryBytes != 15360<<20 {
		t.Fatalf("a name with a comma: %+v, %v", g, err)
	}
	if g, err := ParseNvidiaSMI(nil); err != nil || len(g) != 0 {
		t.Fatalf("no output: %+v, %v", g, err)
	}
	for name, want := range map[string]string{
		"driver-error.txt":   "line 1: want 4 fields",
		"na-memory.csv":      `bad memory.total "[N/A]"`,
		"duplicate.csv":      "line 2: duplicate uuid",
		"control-chars.csv":  "bad name",
		"huge-memory.csv":    "bad memory.total",
		"negative-index.csv": "bad index",
	} {
		if _, err := ParseNvidiaSMI(fixture(t, "nvidia-smi/"+name)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want one saying %q", name, err, want)
		}
	}
	// Random bytes and a flood of lines fail with a short message.
	junk := make([]byte, 4096)
	for i := range junk {
		junk[i] = byte(i*7919 + i/13)
	}
	if _, err := ParseNvidiaSMI(junk); err == nil || len(err.Error()) > 300 {
		t.Errorf("junk: err = %v", err)
	}
	var flood strings.Builder
	for i := range maxGPUs + 1 {
		fmt.Fprintf(&flood, "%d, GPU-%d, X, 1\n", i%maxGPUs, i)
	}
	if _, err := ParseNvidiaSMI([]byte(flood.String())); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("flood: err = %v", err)
	}
}

func TestRunNvidiaSMIBounds(t *testing.T) {
	ctx := context.Background()
	if _, err := NvidiaGPUs(ctx, smiScript(t, "exec yes '0, GPU-a, X, 1'")); err == nil || !strings.Contains(err.Error(), "wrote more than") {
		t.Errorf("endless output: err = %v", err)
	}
	_, err := NvidiaGPUs(ctx, smiScript(t, "echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver' >&2; exit 9"))
	if err == nil || !strings.Contains(err.Error(), "exit status 9") || !strings.Contains(err.Error(), "NVIDIA-SMI has failed") {
		t.Errorf("failing nvidia-smi: err = %v", err)
	}
	// The query is cut off by the caller's context: a hung driver never
	// answers, so only the bound can end it.
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := NvidiaGPUs(short, smiScript(t, "exec sleep 600")); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("hung nvidia-smi: err = %v, want DeadlineExceeded", err)
	}
	t.Setenv("PATH", t.TempDir())
	if _, err := NvidiaGPUs(ctx, ""); !errors.Is(err, ErrNoNvidiaSMI) {
		t.Errorf("no nvidia-smi on PATH: err = %v", err)
	}
}

// TestDetectLive reads this machine.
func TestDetectLive(t *testing.T) {
	r, err := Detect(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	// Nothing changed the affinity mask since the runtime read it.
	if r.CPUs < 1 || r.CPUs != runtime.NumCPU() {
		t.Errorf("CPUs = %d, runtime.NumCPU = %d", r.CPUs, runtime.NumCPU())
	}
	total, err := readMeminfo("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	if r.MemoryBytes == 0 || r.MemoryBytes > total {
		t.Errorf("MemoryBytes = %d, MemTotal %d", r.MemoryBytes, total)
	}
	if r.EffectiveCPUs() <= 0 {
		t.Errorf("EffectiveCPUs = %v", r.EffectiveCPUs())
	}
	t.Logf("live: %d CPUs, quota %v, %d MiB, GPUs %+v (error %v)", r.CPUs, r.CPUQuota, r.MemoryBytes>>20, r.GPUs, r.GPUError)
}
