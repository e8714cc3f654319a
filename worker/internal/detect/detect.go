// Package detect finds the resources a pool agent may offer: the logical
// CPUs this process may run on and its cgroup's CPU quota, the memory it
// may use, and the NVIDIA GPUs that nvidia-smi reports. It needs no cgo, so
// the agent stays a static binary.
package detect

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/fleetlearn/fleetlearn/internal/smallfile"
)

// Resources is what the machine offers this process.
type Resources struct {
	// CPUs is the number of logical CPUs in this process's affinity mask.
	CPUs int
	// CPUQuota is the cgroup v2 cpu.max bandwidth in CPUs (1.5 is one and a
	// half CPUs' worth of time per period), the tightest along the cgroup
	// path; 0 when there is none.
	CPUQuota float64
	// MemoryBytes is MemTotal, capped by the tightest cgroup v2 memory.max
	// along the cgroup path.
	MemoryBytes uint64
	// GPUs are the GPUs nvidia-smi lists; none where it is not installed.
	GPUs []GPU
	// GPUError is why GPU detection failed where nvidia-smi is installed
	// but did not answer sensibly (a driver mismatch, a hang): the machine
	// can still offer its CPUs, so it does not fail Detect.
	GPUError error
}

// EffectiveCPUs is the CPU time the process can use at once: the affinity
// count, capped by the quota.
func (r Resources) EffectiveCPUs() float64 {
	if r.CPUQuota > 0 && r.CPUQuota < float64(r.CPUs) {
		return r.CPUQuota
	}
	return float64(r.CPUs)
}

// GPU is one device as nvidia-smi names it.
type GPU struct {
	Index       int
	UUID        string
	Name        string
	MemoryBytes uint64
}

// Options tune Detect; the zero value reads the running system.
type Options struct {
	// Root prefixes /proc and /sys paths (tests point it at a fixture tree).
	Root string
	// NvidiaSMI is the nvidia-smi to run: "" looks it up on PATH.
	NvidiaSMI string
}

// Detect reads the resources of the running machine as this process sees
// them.
func Detect(ctx context.Context, o Options) (Resources, error) {
	var r Resources
	n, err := affinityCPUs()
	if err != nil {
		// The runtime read the same mask at start-up; it is only stale if
		// the mask changed since.
		n = runtime.NumCPU()
	}
	r.CPUs = n
	mem, err := readMeminfo(filepath.Join(o.Root, "/proc/meminfo"))
	if err != nil {
		return r, fmt.Errorf("detect memory: %w", err)
	}
	r.MemoryBytes = mem
	dir, mnt, err := cgroupPaths(o.Root)
	switch {
	case errors.Is(err, ErrNoCgroup2):
	case err != nil:
		return r, fmt.Errorf("detect cgroup: %w", err)
	default:
		lim, err := cgroupLimits(dir, mnt)
		if err != nil {
			return r, fmt.Errorf("detect cgroup limits: %w", err)
		}
		r.CPUQuota = lim.cpus
		if lim.memory > 0 && lim.memory < r.MemoryBytes {
			r.MemoryBytes = lim.memory
		}
	}
	gpus, err := NvidiaGPUs(ctx, o.NvidiaSMI)
	if err != nil && !errors.Is(err, ErrNoNvidiaSMI) {
		r.GPUError = err
	}
	r.GPUs = gpus
	return r, nil
}

// smallLimit bounds the kernel files read here: each is a few lines.
const smallLimit = 1 << 20

func readMeminfo(path string) (uint64, error) {
	b, err := smallfile.Read(path, smallLimit)
	if err != nil {
		return 0, err
	}
	return ParseMeminfo(b)
}

// ParseMeminfo returns MemTotal, in bytes, from the text of /proc/meminfo.
func ParseMeminfo(b []byte) (uint64, error) {
	s := bufio.NewScanner(bytes.NewReader(b))
	for s.Scan() {
		rest, ok := strings.CutPrefix(s.Text(), "MemTotal:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("parse meminfo: malformed MemTotal line %q", s.Text())
		}
		kb, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil || kb == 0 || kb > math.MaxUint64/1024 {
			return 0, fmt.Errorf("parse meminfo: bad MemTotal %q", f[0])
		}
		return kb * 1024, nil
	}
	if err := s.Err(); err != nil {
		return 0, fmt.Errorf("parse meminfo: %w", err)
	}
	return 0, errors.New("parse meminfo: no MemTotal line")
}

// ErrNoCgroup2 reports a process outside any cgroup v2 hierarchy (a
// cgroup v1 only machine).
var ErrNoCgroup2 = errors.New("no cgroup v2 hierarchy")

// CgroupDir is the directory of this process's cgroup v2 cgroup, found
// from /proc/self/cgroup and /proc/self/mountinfo under root ("" for the
// running system). It wraps ErrNoCgroup2 where there is none.
func CgroupDir(root string) (string, error) {
	dir, _, err := cgroupPaths(root)
	return dir, err
}

// cgroupPaths returns the cgroup's directory and the mount point above it:
// the limits of cgroups above the mount are not visible from here.
func cgroupPaths(root string) (dir, mount string, err error) {
	cg, err := smallfile.Read(filepath.Join(root, "/proc/self/cgroup"), smallLimit)
	if err != nil {
		return "", "", fmt.Errorf("cgroup dir: %w", err)
	}
	mi, err := smallfile.Read(filepath.Join(root, "/proc/self/mountinfo"), 16*smallLimit)
	if err != nil {
		return "", "", fmt.Errorf("cgroup dir: %w", err)
	}
	rel, err := ParseProcCgroup(cg)
	if err != nil {
		return "", "", err
	}
	mnt, mroot, err := ParseCgroup2Mount(mi)
	if err != nil {
		return "", "", err
	}
	// A cgroup namespace shows paths relative to the mount's root already;
	// a bind mount of a subtree shows its root in mountinfo's fourth field.
	if mroot != "/" {
		r, ok := strings.CutPrefix(rel, mroot)
		if !ok {
			return "", "", fmt.Errorf("cgroup dir: cgroup %q is outside the mounted subtree %q: %w", rel, mroot, ErrNoCgroup2)
		}
		rel = "/" + strings.TrimPrefix(r, "/")
	}
	return filepath.Join(root, mnt, rel), filepath.Join(root, mnt), nil
}

// ParseProcCgroup returns the cgroup v2 path (the "0::" line) of
// /proc/<pid>/cgroup.
func ParseProcCgroup(b []byte) (string, error) {
	for line := range strings.SplitSeq(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			if !strings.HasPrefix(p, "/") || strings.Contains(p, "\x00") {
				return "", fmt.Errorf("parse cgroup: bad path %q", p)
			}
			// "(deleted)" marks a cgroup removed under us.
			return filepath.Clean(strings.TrimSuffix(p, " (deleted)")), nil
		}
	}
	return "", fmt.Errorf("parse cgroup: no v2 entry: %w", ErrNoCgroup2)
}

// ParseCgroup2Mount returns the mount point of the cgroup2 file system,
// and the root of the hierarchy mounted there, from /proc/self/mountinfo.
func ParseCgroup2Mount(b []byte) (mountPoint, root string, err error) {
	for line := range strings.SplitSeq(string(b), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		pf, qf := strings.Fields(pre), strings.Fields(post)
		if len(pf) < 5 || len(qf) < 1 || qf[0] != "cgroup2" {
			continue
		}
		return unescapeMount(pf[4]), unescapeMount(pf[3]), nil
	}
	return "", "", fmt.Errorf("parse mountinfo: no cgroup2 mount: %w", ErrNoCgroup2)
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

type limits struct {
	cpus   float64 // 0: none
	memory uint64  // 0: none
}

// cgroupLimits takes the tightest cpu.max and memory.max from dir up to
// the mount point top: a parent's limit binds its children too.
func cgroupLimits(dir, top string) (limits, error) {
	var l limits
	top = filepath.Clean(top)
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		if b, err := smallfile.Read(filepath.Join(d, "cpu.max"), smallLimit); err == nil {
			c, err := ParseCPUMax(b)
			if err != nil {
				return l, fmt.Errorf("%s: %w", filepath.Join(d, "cpu.max"), err)
			}
			if c > 0 && (l.cpus == 0 || c < l.cpus) {
				l.cpus = c
			}
		} else if !errors.Is(err, os.ErrNotExist) {
			return l, err
		}
		if b, err := smallfile.Read(filepath.Join(d, "memory.max"), smallLimit); err == nil {
			m, err := ParseMemoryMax(b)
			if err != nil {
				return l, fmt.Errorf("%s: %w", filepath.Join(d, "memory.max"), err)
			}
			if m > 0 && (l.memory == 0 || m < l.memory) {
				l.memory = m
			}
		} else if !errors.Is(err, os.ErrNotExist) {
			return l, err
		}
		if d == top || d == filepath.Dir(d) || !strings.HasPrefix(d, top) {
			return l, nil
		}
	}
}

// ParseCPUMax returns the bandwidth of a cgroup v2 cpu.max ("$MAX
// $PERIOD") in CPUs, or 0 for "max" (no quota).
func ParseCPUMax(b []byte) (float64, error) {
	f := strings.Fields(string(b))
	if len(f) < 1 || len(f) > 2 {
		return 0, fmt.Errorf("parse cpu.max: want \"$MAX [$PERIOD]\", got %q", truncate(b))
	}
	if f[0] == "max" {
		return 0, nil
	}
	quota, err := strconv.ParseUint(f[0], 10, 63)
	if err != nil || quota == 0 {
		return 0, fmt.Errorf("parse cpu.max: bad quota %q", truncate([]byte(f[0])))
	}
	period := uint64(100000) // the kernel's default, when only $MAX is given
	if len(f) == 2 {
		period, err = strconv.ParseUint(f[1], 10, 63)
		if err != nil || period == 0 {
			return 0, fmt.Errorf("parse cpu.max: bad period %q", truncate([]byte(f[1])))
		}
	}
	return float64(quota) / float64(period), nil
}

// ParseMemoryMax returns a cgroup v2 memory.max in bytes, or 0 for "max".
func ParseMemoryMax(b []byte) (uint64, error) {
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 0, nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse memory.max: bad value %q", truncate(b))
	}
	return v, nil
}

// truncate keeps error messages about hostile input short.
func truncate(b []byte) string {
	const n = 64
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}
