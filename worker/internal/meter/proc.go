package meter

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/fleetlearn/fleetlearn/internal/smallfile"
)

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times: 100 on
// every Linux architecture, whatever the kernel's own HZ.
const clockTicks = 100

// procFileLimit bounds the /proc files read: stat and status are a few KiB.
const procFileLimit = 64 << 10

// maxTree bounds the processes followed in one job's tree, so that a fork
// bomb costs the sampler a bounded walk.
const maxTree = 4096

// procKey names a process across pid reuse.
type procKey struct {
	pid   int
	start uint64 // starttime, in ticks since boot
}

// procStat is what the sampler reads of one process.
type procStat struct {
	ppid  int
	start uint64
	// ticks is utime+stime+cutime+cstime: its own time and that of the
	// children it has waited for, which have left the tree.
	ticks uint64
	rss   uint64 // bytes
	hwm   uint64 // bytes
}

// procTree samples a process and its descendants from /proc.
type procTree struct {
	root     string
	rootKey  procKey
	scanPPid bool // /proc/<pid>/task/*/children is missing: scan every ppid
	ticks    uint64
	peak     uint64
}

func newProcTree(root string, pid int) (*procTree, error) {
	st, err := readProc(root, pid)
	if err != nil {
		return nil, fmt.Errorf("read root process: %w", err)
	}
	t := &procTree{root: root, rootKey: procKey{pid, st.start}}
	if _, err := os.Stat(filepath.Join(root, strconv.Itoa(pid), "task", strconv.Itoa(pid), "children")); err != nil {
		t.scanPPid = true
	}
	return t, nil
}

func (t *procTree) cpuSeconds() float64 { return float64(t.ticks) / clockTicks }

// sample walks the tree once. The CPU figure never goes down: a descendant
// that was orphaned and left the tree takes its time with it, and the
// running maximum keeps what it had been seen to use.
func (t *procTree) sample() {
	procs := t.walk()
	var ticks, rss, hwm uint64
	for _, st := range procs {
		ticks += st.ticks
		rss += st.rss
		hwm = max(hwm, st.hwm)
	}
	t.ticks = max(t.ticks, ticks)
	// The tree's processes peak at different moments: the sum of their
	// resident sets now, and each one's own high-water mark, are both
	// lower bounds of the tree's peak.
	t.peak = max(t.peak, rss, hwm)
}

// walk returns the live processes of the tree: none once the root is gone
// or its pid has been reused.
func (t *procTree) walk() map[procKey]procStat {
	out := map[procKey]procStat{}
	st, err := readProc(t.root, t.rootKey.pid)
	if err != nil || st.start != t.rootKey.start {
		return out
	}
	out[t.rootKey] = st
	var byParent map[int][]int
	if t.scanPPid {
		byParent = t.scanParents()
	}
	queue := []procKey{t.rootKey}
	for len(queue) > 0 && len(out) < maxTree {
		parent := queue[0]
		queue = queue[1:]
		var kids []int
		if t.scanPPid {
			kids = byParent[parent.pid]
		} else {
			kids = t.children(parent.pid)
		}
		for _, pid := range kids {
			st, err := readProc(t.root, pid)
			// A child that started before its parent is a reused pid.
			if err != nil || st.ppid != parent.pid || st.start < parent.start {
				continue
			}
			k := procKey{pid, st.start}
			if _, seen := out[k]; seen || len(out) >= maxTree {
				continue
			}
			out[k] = st
			queue = append(queue, k)
		}
	}
	return out
}

// children lists the children of every thread of pid: any thread may fork.
func (t *procTree) children(pid int) []int {
	tasks, err := os.ReadDir(filepath.Join(t.root, strconv.Itoa(pid), "task"))
	if err != nil {
		return nil
	}
	var kids []int
	for _, task := range tasks {
		b, err := smallfile.Read(filepath.Join(t.root, strconv.Itoa(pid), "task", task.Name(), "children"), procFileLimit)
		if err != nil {
			continue
		}
		for f := range strings.FieldsSeq(string(b)) {
			if k, err := strconv.Atoi(f); err == nil && k > 0 {
				kids = append(kids, k)
			}
		}
	}
	return kids
}

// scanParents maps each parent pid to its children, from every process's
// stat: for kernels without CONFIG_PROC_CHILDREN.
func (t *procTree) scanParents() map[int][]int {
	ents, err := os.ReadDir(t.root)
	if err != nil {
		return nil
	}
	m := map[int][]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		b, err := smallfile.Read(filepath.Join(t.root, e.Name(), "stat"), procFileLimit)
		if err != nil {
			continue
		}
		if f, err := statFields(b); err == nil {
			if ppid, err := strconv.Atoi(f[1]); err == nil {
				m[ppid] = append(m[ppid], pid)
			}
		}
	}
	return m
}

func readProc(root string, pid int) (procStat, error) {
	dir := filepath.Join(root, strconv.Itoa(pid))
	b, err := smallfile.Read(filepath.Join(dir, "stat"), procFileLimit)
	if err != nil {
		return procStat{}, err
	}
	st, err := parseStat(b)
	if err != nil {
		return procStat{}, fmt.Errorf("%s: %w", filepath.Join(dir, "stat"), err)
	}
	// A zombie has no status memory lines: it holds no memory any more.
	if b, err := smallfile.Read(filepath.Join(dir, "status"), procFileLimit); err == nil {
		st.rss, st.hwm = parseStatusMemory(b)
	}
	return st, nil
}

// statFields returns the fields of /proc/<pid>/stat after the command
// name, which is in parentheses and may itself hold spaces and
// parentheses: f[0] is the state (field 3 in proc(5)).
func statFields(b []byte) ([]string, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, errors.New("parse stat: no command name")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return nil, fmt.Errorf("parse stat: %d fields after the name, want at least 20", len(f))
	}
	return f, nil
}

func parseStat(b []byte) (procStat, error) {
	f, err := statFields(b)
	if err != nil {
		return procStat{}, err
	}
	// proc(5) numbers fields from 1 with the pid; f[0] is field 3.
	field := func(n int) (uint64, error) {
		v, err := strconv.ParseUint(f[n-3], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parse stat: field %d: %w", n, err)
		}
		return v, nil
	}
	var st procStat
	ppid, err := field(4)
	if err != nil {
		return st, err
	}
	st.ppid = int(ppid)
	for _, n := range []int{14, 15, 16, 17} { // utime stime cutime cstime
		v, err := field(n)
		if err != nil {
			return st, err
		}
		st.ticks += v
	}
	if st.start, err = field(22); err != nil {
		return st, err
	}
	return st, nil
}

// parseStatusMemory reads VmRSS and VmHWM, in bytes, from
// /proc/<pid>/status; absent lines read as 0.
func parseStatusMemory(b []byte) (rss, hwm uint64) {
	for line := range strings.SplitSeq(string(b), "\n") {
		var dst *uint64
		switch {
		case strings.HasPrefix(line, "VmRSS:"):
			dst = &rss
		case strings.HasPrefix(line, "VmHWM:"):
			dst = &hwm
		default:
			continue
		}
		f := strings.Fields(line)
		if len(f) == 3 && f[2] == "kB" {
			if kb, err := strconv.ParseUint(f[1], 10, 44); err == nil {
				*dst = kb * 1024
			}
		}
	}
	return rss, hwm
}
