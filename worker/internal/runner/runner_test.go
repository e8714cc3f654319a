package runner

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/pool/stepdir"
)

// guard bounds every wait on a child; it is a last resort for a hung test on
// a loaded machine, never the way the test synchronises.
const guard = 2 * time.Minute

func python(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not in PATH: the runner's end-to-end tests drive real Python scripts")
	}
	// Resolve version-manager shims (pyenv and the like), which add their
	// own variables to the environment the tests inspect.
	out, err := exec.Command(p, "-c", "import sys; print(sys.executable)").Output()
	if err != nil {
		t.Skipf("python3 at %s does not run: %v", p, err)
	}
	return strings.TrimSpace(string(out))
}

func script(t *testing.T, name string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func topo() Topology {
	return Topology{Rank: 3, WorldSize: 4, LocalRank: 1, LocalWorldSize: 2,
		GroupRank: 1, GroupWorldSize: 2, MasterAddr: "10.0.0.7", MasterPort: 29500}
}

// lines collects streamed output and lets a test wait for a line.
type lines struct {
	mu   sync.Mutex
	all  []string
	cond chan struct{} // replaced on every line
}

func newLines() *lines { return &lines{cond: make(chan struct{})} }

func (l *lines) add(_ Stream, s string) {
	l.mu.Lock()
	l.all = append(l.all, s)
	close(l.cond)
	l.cond = make(chan struct{})
	l.mu.Unlock()
}

// await returns the first line with prefix, or fails once the process has
// ended (done closed) without printing it.
func (l *lines) await(t *testing.T, prefix string, done <-chan struct{}) string {
	t.Helper()
	timeout := time.After(guard)
	for {
		l.mu.Lock()
		for _, s := range l.all {
			if strings.HasPrefix(s, prefix) {
				l.mu.Unlock()
				return s
			}
		}
		c := l.cond
		l.mu.Unlock()
		select {
		case <-c:
		case <-done:
			// One last look: the line may have come with the exit.
			l.mu.Lock()
			defer l.mu.Unlock()
			for _, s := range l.all {
				if strings.HasPrefix(s, prefix) {
					return s
				}
			}
			t.Fatalf("process ended without printing %q; output:\n%s", prefix, strings.Join(l.all, "\n"))
		case <-timeout:
			t.Fatalf("no %q within %v", prefix, guard)
		}
	}
}

func waitChan(p *Process) <-chan struct{} { return p.done }

// startGuarded starts s and makes sure the rank is gone when the test ends,
// however it ends.
func startGuarded(t *testing.T, s Spec) *Process {
	t.Helper()
	p, err := Start(s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Kill()
		select {
		case <-p.done:
		case <-time.After(guard):
			t.Errorf("rank %d did not end after Kill", p.Pid())
		}
	})
	return p
}

// waitGuarded is Wait with the last-resort guard.
func waitGuarded(t *testing.T, p *Process) (Result, error) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(guard):
		t.Fatalf("rank %d still running after %v", p.Pid(), guard)
	}
	return p.Wait()
}

func trainSpec(t *testing.T, py, dir string, steps, every int64) Spec {
	return Spec{
		Command:         []string{py, script(t, "train.py")},
		Dir:             filepath.Join(dir, "rank-3"),
		CheckpointDir:   filepath.Join(dir, "ckpt"),
		Topology:        topo(),
		Steps:           steps,
		CheckpointEvery: every,
		Grace:           time.Second,
	}
}

// readParams reads a checkpoint's parameters with the repository's reader.
func readParams(t *testing.T, ckpt string) *model.Model {
	t.Helper()
	f, err := os.Open(filepath.Join(ckpt, stepdir.ModelFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := model.ReadSafetensors(f)
	if err != nil {
		t.Fatalf("read %s: %v", ckpt, err)
	}
	return m
}

func bitsEqual(t *testing.T, got, want *model.Model) {
	t.Helper()
	if len(got.Tensors) != len(want.Tensors) {
		t.Fatalf("got %d tensors, want %d", len(got.Tensors), len(want.Tensors))
	}
	for i, w := range want.Tensors {
		g := got.Tensors[i]
		if g.Name != w.Name || fmt.Sprint(g.Shape) != fmt.Sprint(w.Shape) || len(g.Data) != len(w.Data) {
			t.Fatalf("tensor %d: got %s%v, want %s%v", i, g.Name, g.Shape, w.Name, w.Shape)
		}
		for j := range w.Data {
			if math.Float32bits(g.Data[j]) != math.Float32bits(w.Data[j]) {
				t.Fatalf("%s[%d] = %v (%#x), want %v (%#x)", w.Name, j, g.Data[j],
					math.Float32bits(g.Data[j]), w.Data[j], math.Float32bits(w.Data[j]))
			}
		}
	}
}

func TestTrainKillResumeBitwise(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a Python training script three times")
	}
	py := python(t)
	const steps, every = 60, 10

	// (a) A fresh run to the end gives the reference parameters P.
	fresh := trainSpec(t, py, t.TempDir(), steps, every)
	res, err := Run(context.Background(), fresh)
	if err != nil {
		t.Fatalf("fresh run: %v\n%s", err, res.Tail)
	}
	if !bytes.Contains(res.Tail, []byte("done step=60")) {
		t.Fatalf("fresh run did not finish:\n%s", res.Tail)
	}
	step, path, err := stepdir.Latest(fresh.CheckpointDir)
	if err != nil || step != steps {
		t.Fatalf("fresh LatestCheckpoint = %d, %q, %v; want step %d", step, path, err, steps)
	}
	// (c) The script's hand-written safetensors read with the repo's reader.
	p := readParams(t, path)
	if len(p.Tensors) != 2 || p.Tensors[0].Name != "linear.weight" || p.Tensors[1].Name != "linear.bias" {
		t.Fatalf("unexpected tensors in %s: %+v", path, p.Tensors)
	}
	if !slicesNonZero(p.Tensors[0].Data) {
		t.Fatalf("weights never moved from zero: %v", p.Tensors[0].Data)
	}

	// (b) A run killed with SIGKILL to its group while writing its third
	// checkpoint, after two were committed, leaves step-30.tmp behind.
	dir := t.TempDir()
	killed := trainSpec(t, py, dir, steps, every)
	killed.Env = map[string]string{"TRAIN_HANG_IN_CHECKPOINT": "30"}
	out := newLines()
	killed.OnLine = out.add
	proc := startGuarded(t, killed)
	out.await(t, "checkpoint step=10", waitChan(proc))
	out.await(t, "hanging step=30", waitChan(proc))
	proc.Kill()
	res, err = waitGuarded(t, proc)
	var ee *ExitError
	if !errors.Is(err, ErrStopped) || !errors.As(err, &ee) || ee.Signal != syscall.SIGKILL {
		t.Fatalf("killed run: err = %v, want ErrStopped by SIGKILL", err)
	}
	if _, err := os.Stat(filepath.Join(killed.CheckpointDir, "step-30.tmp", stepdir.ModelFile)); err != nil {
		t.Fatalf("the killed run should have left a partial step-30.tmp: %v", err)
	}
	// (f) The torn .tmp is ignored; the newest committed checkpoint wins.
	step, path, err = stepdir.Latest(killed.CheckpointDir)
	if err != nil || step != 20 || path != filepath.Join(killed.CheckpointDir, "step-20") {
		t.Fatalf("after kill LatestCheckpoint = %d, %q, %v; want step 20", step, path, err)
	}

	resumed := trainSpec(t, py, dir, steps, every)
	resumed.ResumeFrom = path
	resumed.RestartCount = 1
	res, err = Run(context.Background(), resumed)
	if err != nil {
		t.Fatalf("resumed run: %v\n%s", err, res.Tail)
	}
	for _, want := range []string{"resumed step=20", "env TORCHELASTIC_RESTART_COUNT=1", "checkpoint step=30", "done step=60"} {
		if !bytes.Contains(res.Tail, []byte(want)) {
			t.Fatalf("resumed run output lacks %q:\n%s", want, res.Tail)
		}
	}
	if bytes.Contains(res.Tail, []byte("checkpoint step=20 ")) {
		t.Fatalf("resumed run redid step 20:\n%s", res.Tail)
	}
	step, path, err = stepdir.Latest(resumed.CheckpointDir)
	if err != nil || step != steps {
		t.Fatalf("resumed LatestCheckpoint = %d, %q, %v", step, path, err)
	}
	if _, err := os.Stat(filepath.Join(resumed.CheckpointDir, "step-30.tmp")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("step-30.tmp should have been replaced by the resumed run: %v", err)
	}
	bitsEqual(t, readParams(t, path), p)
}

func slicesNonZero(v []float32) bool {
	for _, x := range v {
		if x != 0 {
			return true
		}
	}
	return false
}

func TestEnvironment(t *testing.T) {
	py := python(t)
	t.Setenv("FLEETLEARN_TEST_WORKER_SECRET", "s3cr3t-token-value")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-aws")
	dir := t.TempDir()
	resume := filepath.Join(dir, "ckpt", "step-5")
	if err := os.MkdirAll(resume, 0o750); err != nil {
		t.Fatal(err)
	}
	s := Spec{
		Command:         []string{py, script(t, "env.py")},
		Dir:             filepath.Join(dir, "work"),
		CheckpointDir:   filepath.Join(dir, "ckpt"),
		ResumeFrom:      resume,
		Env:             map[string]string{"JOB_MODE": "fine tune", "PATH": os.Getenv("PATH")},
		Topology:        topo(),
		RunID:           "job-42",
		RestartCount:    2,
		MaxRestarts:     3,
		Steps:           100,
		CheckpointEvery: 25,
	}
	res, err := Run(context.Background(), s)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, res.Tail)
	}
	got := map[string]string{}
	for _, l := range strings.Split(string(res.Tail), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			got[k] = v
		}
	}
	want := map[string]string{
		"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
		"GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "ROLE_RANK": "3", "ROLE_WORLD_SIZE": "4",
		"ROLE_NAME": "default", "MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "29500",
		"TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_MAX_RESTARTS": "3", "TORCHELASTIC_RUN_ID": "job-42",
		EnvCheckpointDir: s.CheckpointDir, EnvResumeFrom: resume, EnvSteps: "100", EnvCheckpointEvery: "25",
		"JOB_MODE": "fine tune", "PATH": os.Getenv("PATH"),
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	// Only the inherited basics may appear beyond what the runner set;
	// os/exec sets PWD for the working directory, and Python adds LC_CTYPE
	// when it coerces a C locale (PEP 538).
	allowed := map[string]bool{"HOME": true, "LANG": true, "LC_CTYPE": true, "PWD": true}
	for k := range got {
		if _, ok := want[k]; !ok && !allowed[k] {
			t.Errorf("unexpected variable %s=%q reached the script", k, got[k])
		}
	}
	if bytes.Contains(res.Tail, []byte("s3cr3t")) {
		t.Errorf("a worker secret reached the script:\n%s", res.Tail)
	}
	cwd, err := filepath.EvalSymlinks(s.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if pwd, _ := filepath.EvalSymlinks(got["PWD"]); got["PWD"] != "" && pwd != cwd {
		t.Errorf("PWD = %q, want %q", got["PWD"], cwd)
	}
}

func TestWorkingDirectory(t *testing.T) {
	dir := t.TempDir()
	s := Spec{
		Command:       []string{"/bin/sh", "-c", "pwd -P; echo hello > out.txt"},
		Dir:           filepath.Join(dir, "ranks", "0"),
		CheckpointDir: filepath.Join(dir, "ckpt"),
		Topology:      Topology{WorldSize: 1, LocalWorldSize: 1, GroupWorldSize: 1, MasterAddr: "127.0.0.1", MasterPort: 29500},
	}
	res, err := Run(context.Background(), s)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, res.Tail)
	}
	want, _ := filepath.EvalSymlinks(s.Dir)
	if got := strings.TrimSpace(string(res.Tail)); got != want {
		t.Errorf("pwd = %q, want %q", got, want)
	}
	if b, err := os.ReadFile(filepath.Join(s.Dir, "out.txt")); err != nil || string(b) != "hello\n" {
		t.Errorf("out.txt = %q, %v", b, err)
	}
	if fi, err := os.Stat(s.CheckpointDir); err != nil || !fi.IsDir() {
		t.Errorf("checkpoint dir not created: %v", err)
	}
}

// gone reports whether pid has exited (a zombie counts: it runs nothing).
func gone(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// The state follows the parenthesised command name.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && (s[i+2] == 'Z' || s[i+2] == 'X')
}

func awaitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(guard)
	for !gone(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d still running after %v", pid, guard)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestCancelKillsProcessGroup(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("inspects /proc")
	}
	py := python(t)
	for _, tc := range []struct {
		name string
		args []string
		sig  syscall.Signal // how the leader ends
	}{
		{"honours SIGTERM", nil, syscall.SIGTERM},
		{"ignores SIGTERM", []string{"ignore-term"}, syscall.SIGKILL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			out := newLines()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s := Spec{
				Command:       append([]string{py, script(t, "tree.py")}, tc.args...),
				Dir:           dir,
				CheckpointDir: filepath.Join(dir, "ckpt"),
				Topology:      topo(),
				OnLine:        out.add,
				// Short, since the SIGKILL case must wait it out; the
				// test never relies on it being long enough for anything.
				Grace: 200 * time.Millisecond,
			}
			type result struct {
				res Result
				err error
			}
			ended := make(chan struct{})
			var r result
			go func() {
				r.res, r.err = Run(ctx, s)
				close(ended)
			}()
			out.await(t, "ready", ended)
			childLine := out.await(t, "child=", ended)
			child, err := strconv.Atoi(strings.TrimPrefix(childLine, "child="))
			if err != nil {
				t.Fatal(err)
			}
			if gone(child) {
				t.Fatalf("child %d not running before cancel", child)
			}
			cancel()
			select {
			case <-ended:
			case <-time.After(guard):
				t.Fatal("Run did not return after cancel")
			}
			var ee *ExitError
			if !errors.Is(r.err, ErrStopped) || !errors.Is(r.err, context.Canceled) || !errors.As(r.err, &ee) {
				t.Fatalf("err = %v, want ErrStopped and context.Canceled", r.err)
			}
			if ee.Signal != tc.sig {
				t.Errorf("leader ended by %v, want %v", ee.Signal, tc.sig)
			}
			// The child was in the group; it must be gone too. It is not
			// our child, so it is reaped by init: wait for that.
			awaitGone(t, child)
		})
	}
}

func TestLeftoverChildrenKilledOnExit(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("inspects /proc")
	}
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "bg.pid")
	s := Spec{
		// The shell leaves a background sleeper and exits 0 at once.
		Command:       []string{"/bin/sh", "-c", "sleep 3600 >/dev/null 2>&1 & echo $! > " + pidFile},
		Dir:           dir,
		CheckpointDir: filepath.Join(dir, "ckpt"),
		Topology:      topo(),
	}
	if res, err := Run(context.Background(), s); err != nil {
		t.Fatalf("run: %v\n%s", err, res.Tail)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	awaitGone(t, pid)
}

func TestExitStatus(t *testing.T) {
	dir := t.TempDir()
	base := Spec{Dir: dir, CheckpointDir: filepath.Join(dir, "ckpt"), Topology: topo()}
	run := func(cmd ...string) (Result, error) {
		s := base
		s.Command = cmd
		return Run(context.Background(), s)
	}
	res, err := run("/bin/sh", "-c", "echo bye >&2; exit 3")
	var ee *ExitError
	if !errors.Is(err, ErrExit) || !errors.As(err, &ee) || ee.Code != 3 || res.ExitCode != 3 {
		t.Errorf("exit 3: err = %v, code %d", err, res.ExitCode)
	}
	if errors.Is(err, ErrSignaled) || errors.Is(err, ErrStopped) {
		t.Errorf("exit 3 matches more than one sentinel: %v", err)
	}
	if string(res.Tail) != "bye\n" {
		t.Errorf("stderr tail = %q", res.Tail)
	}
	res, err = run("/bin/sh", "-c", "kill -SEGV $$")
	if !errors.Is(err, ErrSignaled) || !errors.As(err, &ee) || ee.Signal != syscall.SIGSEGV || res.ExitCode != -1 {
		t.Errorf("SIGSEGV: err = %v, code %d", err, res.ExitCode)
	}
	if _, err := run(filepath.Join(dir, "no-such-program")); !errors.Is(err, ErrStart) {
		t.Errorf("missing program: err = %v, want ErrStart", err)
	}
	if res, err := run("/bin/true"); err != nil || res.ExitCode != 0 {
		t.Errorf("true: %v, code %d", err, res.ExitCode)
	}
}

func TestSpecValidation(t *testing.T) {
	dir := t.TempDir()
	good := Spec{Command: []string{"/bin/true"}, Dir: dir, CheckpointDir: filepath.Join(dir, "c"), Topology: topo()}
	long := strings.Repeat("v", MaxEnvValueBytes+1)
	many := map[string]string{}
	for i := range MaxEnvVars + 1 {
		many[fmt.Sprintf("V%d", i)] = "x"
	}
	big := map[string]string{}
	for i := range MaxEnvTotalBytes/MaxEnvValueBytes + 1 {
		big[fmt.Sprintf("V%d", i)] = long[:MaxEnvValueBytes]
	}
	for _, tc := range []struct {
		name string
		edit func(*Spec)
		want error
	}{
		{"no command", func(s *Spec) { s.Command = nil }, ErrInvalidSpec},
		{"relative dir", func(s *Spec) { s.Dir = "rank0" }, ErrInvalidSpec},
		{"relative checkpoint dir", func(s *Spec) { s.CheckpointDir = "ckpt" }, ErrInvalidSpec},
		{"missing resume", func(s *Spec) { s.ResumeFrom = filepath.Join(dir, "nope") }, ErrInvalidSpec},
		{"rank beyond world", func(s *Spec) { s.Topology.Rank = 4 }, ErrInvalidSpec},
		{"local rank beyond local world", func(s *Spec) { s.Topology.LocalRank = 2 }, ErrInvalidSpec},
		{"group rank beyond nodes", func(s *Spec) { s.Topology.GroupRank = 2 }, ErrInvalidSpec},
		{"port zero", func(s *Spec) { s.Topology.MasterPort = 0 }, ErrInvalidSpec},
		{"blank master", func(s *Spec) { s.Topology.MasterAddr = "" }, ErrInvalidSpec},
		{"negative steps", func(s *Spec) { s.Steps = -1 }, ErrInvalidSpec},
		{"env overrides RANK", func(s *Spec) { s.Env = map[string]string{"RANK": "0"} }, ErrInvalidEnv},
		{"env overrides our prefix", func(s *Spec) { s.Env = map[string]string{"FLEETLEARN_RESUME_FROM": "/x"} }, ErrInvalidEnv},
		{"env overrides torchelastic", func(s *Spec) { s.Env = map[string]string{"TORCHELASTIC_RESTART_COUNT": "9"} }, ErrInvalidEnv},
		{"env name with =", func(s *Spec) { s.Env = map[string]string{"A=B": "1"} }, ErrInvalidEnv},
		{"env name with digit first", func(s *Spec) { s.Env = map[string]string{"1A": "1"} }, ErrInvalidEnv},
		{"env name empty", func(s *Spec) { s.Env = map[string]string{"": "1"} }, ErrInvalidEnv},
		{"env value NUL", func(s *Spec) { s.Env = map[string]string{"A": "x\x00y"} }, ErrInvalidEnv},
		{"env value too long", func(s *Spec) { s.Env = map[string]string{"A": long} }, ErrInvalidEnv},
		{"too many env vars", func(s *Spec) { s.Env = many }, ErrInvalidEnv},
		{"env too large in all", func(s *Spec) { s.Env = big }, ErrInvalidEnv},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := good
			s.Topology = topo()
			tc.edit(&s)
			if _, err := Start(s); !errors.Is(err, tc.want) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
		})
	}
	if p, err := Start(good); err != nil {
		t.Fatalf("good spec: %v", err)
	} else if _, err := p.Wait(); err != nil {
		t.Fatalf("good spec: %v", err)
	}
}

func TestHostileLogFloodIsBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("pushes a gigabyte through the log pipes")
	}
	py := python(t)
	const mib = 1024
	dir := t.TempDir()
	var nLines, maxLine int
	var lastOut string
	s := Spec{
		Command:       []string{py, script(t, "flood.py"), strconv.Itoa(mib)},
		Dir:           dir,
		CheckpointDir: filepath.Join(dir, "ckpt"),
		Topology:      topo(),
		TailBytes:     32 << 10,
		MaxLine:       4 << 10,
		OnLine: func(st Stream, l string) {
			nLines++
			maxLine = max(maxLine, len(l))
			if st == Stdout {
				lastOut = l
			}
		},
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	peak := peakHeap()
	res, err := Run(context.Background(), s)
	heapPeak := peak()
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	wantBytes := int64(mib<<20) + int64(len("\nflood-end\n"))
	if res.LogBytes != wantBytes {
		t.Errorf("LogBytes = %d, want %d", res.LogBytes, wantBytes)
	}
	// The two pipes are drained concurrently, so which stream's bytes end
	// the tail is up to the scheduler; order within a stream is not.
	if len(res.Tail) != s.TailBytes || bytes.IndexFunc(res.Tail, func(r rune) bool { return !strings.ContainsRune("xy\nflood-end", r) }) >= 0 {
		t.Errorf("tail: %d bytes, %q...", len(res.Tail), res.Tail[:min(40, len(res.Tail))])
	}
	if lastOut != "flood-end" {
		t.Errorf("last stdout line %q, want flood-end", lastOut[:min(40, len(lastOut))])
	}
	if maxLine > s.MaxLine {
		t.Errorf("a line of %d bytes reached the callback, limit %d", maxLine, s.MaxLine)
	}
	// 512 MiB of unterminated text in 4 KiB pieces plus 512 Ki real lines.
	if nLines < 512<<10 {
		t.Errorf("only %d lines delivered", nLines)
	}
	// The strings handed to the callback are garbage at once; what must
	// not happen is the heap growing with the output.
	if heapPeak > before.HeapAlloc+64<<20 {
		t.Errorf("heap peaked at %d MiB (started at %d MiB) for %d MiB of output",
			heapPeak>>20, before.HeapAlloc>>20, mib)
	}
	t.Logf("%d MiB of output, %d lines, heap %d -> peak %d -> %d MiB", mib, nLines,
		before.HeapAlloc>>20, heapPeak>>20, after.HeapAlloc>>20)
}

// peakHeap samples HeapAlloc until the returned function is called, which
// reports the largest value seen.
func peakHeap() func() uint64 {
	stop := make(chan struct{})
	res := make(chan uint64)
	go func() {
		var peak uint64
		var m runtime.MemStats
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			runtime.ReadMemStats(&m)
			peak = max(peak, m.HeapAlloc)
			select {
			case <-stop:
				res <- peak
				return
			case <-tick.C:
			}
		}
	}()
	return func() uint64 { close(stop); return <-res }
}

func TestLogSinkKeepsNewestBytes(t *testing.T) {
	var got []string
	l := newLogSink(8, 5, func(st Stream, s string) { got = append(got, st.String()+":"+s) })
	out := &streamWriter{sink: l, stream: Stdout}
	errw := &streamWriter{sink: l, stream: Stderr}
	for _, w := range []struct {
		w *streamWriter
		s string
	}{{out, "ab"}, {out, "c\r\nde"}, {errw, "0123456789\n"}, {out, "fg"}, {out, "\nhij"}} {
		if _, err := w.w.Write([]byte(w.s)); err != nil {
			t.Fatal(err)
		}
	}
	out.flush()
	errw.flush()
	all := "abc\r\nde0123456789\nfg\nhij"
	tail, total := l.tail()
	if string(tail) != all[len(all)-8:] || total != int64(len(all)) {
		t.Errorf("tail %q of %d bytes, want %q of %d", tail, total, all[len(all)-8:], len(all))
	}
	want := []string{"stdout:abc", "stderr:01234", "stderr:56789", "stdout:defg", "stdout:hij"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("lines %q, want %q", got, want)
	}
	// A single write larger than the ring keeps only its end.
	big := newLogSink(4, 16, nil)
	w := &streamWriter{sink: big, stream: Stdout}
	w.Write([]byte("xy"))
	w.Write([]byte("0123456789"))
	if tail, _ := big.tail(); string(tail) != "6789" {
		t.Errorf("tail after a large write %q, want 6789", tail)
	}
	w.Write([]byte("ab"))
	if tail, _ := big.tail(); string(tail) != "89ab" {
		t.Errorf("tail after wrap %q, want 89ab", tail)
	}
}
