package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/pool/checkpoint"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/worker/internal/trainer"
)

// TestMain lets the test binary be a rank ("rank --lease FILE", as the agent
// runs it) or an agent (FLEETLEARN_TEST_AGENT=ADDR, for the kill -9 test).
func TestMain(m *testing.M) {
	if len(os.Args) == 4 && os.Args[1] == "rank" && os.Args[2] == "--lease" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		err := RunRank(ctx, os.Args[3])
		stop()
		os.Exit(RankExitCode(err))
	}
	if addr := os.Getenv("FLEETLEARN_TEST_AGENT"); addr != "" {
		a, err := New(Config{Server: addr, Insecure: true, Token: "t", WorkDir: os.Getenv("FLEETLEARN_TEST_WORKDIR"),
			Capacity: Capacity{MilliCPU: 1000, MemoryBytes: 1 << 30}})
		if err == nil {
			err = a.Run(context.Background())
		}
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

func builtinLease(job string, attempt uint32, steps, every int64, resume int64) *pb.RankLease {
	return &pb.RankLease{JobId: job, Attempt: attempt, Rank: 0, WorldSize: 1, ResumeStep: resume, LocalWorldSize: 1, GroupWorldSize: 1,
		Spec: &pb.PoolJobSpec{Id: job, Ranks: 1, TotalSteps: steps, CheckpointInterval: every,
			Program: &pb.PoolJobSpec_Builtin{Builtin: &pb.PoolBuiltinTrainer{
				Arch: []uint32{784, 16, 10}, InitSeed: 3, Seed: 7, BatchSize: 16, LearningRate: 0.1,
				Dataset: &pb.PoolDataset{Source: "mnist-test", First: 100, Count: 512}}}}}
}

func startAgent(t *testing.T, addr string) {
	t.Helper()
	a, err := New(Config{Server: addr, Insecure: true, Token: "t", WorkDir: t.TempDir(),
		Capacity: Capacity{MilliCPU: 2000, MemoryBytes: 1 << 30}, Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("agent: %v", err)
		}
	})
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// TestRankStopsAtCheckpointAndResumes runs a built-in rank as a child of
// the agent, asks it to stop at a checkpoint while the commit of step 5 is
// held, and resumes it in a second attempt: it must stop at step 15 and end
// bitwise equal, checkpoint ids included, to a run never interrupted. The
// Saver's two buffers let the rank take step 10's checkpoint while 5's
// commit is held; at 15 it waits for a buffer, and that is where the stop
// finds it.
func TestRankStopsAtCheckpointAndResumes(t *testing.T) {
	if testing.Short() {
		t.Skip("trains in child processes")
	}
	p, addr := newPool(t)
	release := make(chan struct{})
	p.gate = func(step int64) {
		if step == 5 {
			<-release
		}
	}
	startAgent(t, addr)
	const job, steps, every = "mlp", 40, 5
	p.lease(builtinLease(job, 1, steps, every, 0))
	p.waitFor(t, "the rank to pass step 10's checkpoint", func() bool {
		for _, s := range p.statuses {
			if s.GetStep() >= 14 {
				return true
			}
		}
		return false
	})
	p.update(func() {
		p.stops = append(p.stops, &pb.RankStop{JobId: job, Attempt: 1, AtCheckpoint: true, Reason: "preempted"})
	})
	p.waitFor(t, "the rank to take the stop", func() bool { return p.logged("stop requested") })
	close(release)
	p.waitFor(t, "attempt 1 to end", func() bool { return p.exit(job, 1) != nil })
	ex := p.exit(job, 1)
	if !ex.GetStopped() || ex.GetCompleted() || ex.GetError() != "" {
		t.Fatalf("attempt 1 ended %+v, want stopped", ex)
	}
	if ex.GetUsage().GetCpuSeconds() <= 0 || ex.GetUsage().GetMeter() == "" || len(ex.GetDataSha256()) != 64 {
		t.Fatalf("attempt 1 usage %+v, data %q", ex.GetUsage(), ex.GetDataSha256())
	}
	store := p.stores[job+"-0"]
	mid, err := checkpoint.LoadLatest(store)
	if err != nil {
		t.Fatal(err)
	}
	if mid.Step != 15 {
		t.Fatalf("stopped at checkpoint step %d, want 15: the checkpoint after the signal", mid.Step)
	}

	p.lease(builtinLease(job, 2, steps, every, mid.Step))
	p.waitFor(t, "attempt 2 to end", func() bool { return p.exit(job, 2) != nil })
	if ex := p.exit(job, 2); !ex.GetCompleted() {
		t.Fatalf("attempt 2 ended %+v, want completed", ex)
	}
	got, err := checkpoint.LoadLatest(store)
	if err != nil {
		t.Fatal(err)
	}

	cfg, digest, err := trainerConfig(builtinLease(job, 1, steps, every, 0), "")
	if err != nil {
		t.Fatal(err)
	}
	if digest != ex.GetDataSha256() {
		t.Fatalf("data digest %s, rank reported %s", digest, ex.GetDataSha256())
	}
	if cfg.Store, err = checkpoint.OpenDir(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	want, err := trainer.Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got.Step != steps || got.ID != want.Checkpoint || got.Params.HashHex() != want.Digest {
		t.Fatalf("resumed run ended at step %d, checkpoint %s, model %s; uninterrupted: %s, model %s",
			got.Step, got.ID, got.Params.HashHex(), want.Checkpoint, want.Digest)
	}
	if !p.logged("1/agent: rank stopped") || !p.logged("2/agent: rank completed") {
		t.Fatalf("agent lines missing from the log: %q", p.logs)
	}
}

// TestRanksDieWithAgent kills the agent with SIGKILL, which it cannot
// handle, and expects its rank to die with it (Pdeathsig).
func TestRanksDieWithAgent(t *testing.T) {
	if testing.Short() {
		t.Skip("runs an agent and a rank as processes")
	}
	p, addr := newPool(t)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "FLEETLEARN_TEST_AGENT="+addr, "FLEETLEARN_TEST_WORKDIR="+t.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	// A command rank that writes nothing: a built-in rank would also die
	// of SIGPIPE on its next report line, which would hide a missing
	// Pdeathsig.
	p.lease(&pb.RankLease{JobId: "sleeper", Attempt: 1, WorldSize: 1, LocalWorldSize: 1, GroupWorldSize: 1, MasterAddr: "127.0.0.1", MasterPort: 29500,
		Spec: &pb.PoolJobSpec{Id: "sleeper", Ranks: 1, TotalSteps: 1, CheckpointInterval: 1,
			Program: &pb.PoolJobSpec_Command{Command: &pb.PoolCommand{Argv: []string{"sleep", "600"}}}}})
	p.waitFor(t, "the rank to start", func() bool { return p.logged("1/agent: rank 0 of 1 started") })
	kids := children(t, cmd.Process.Pid)
	if len(kids) != 1 {
		t.Fatalf("agent has children %v, want one rank", kids)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	guard := time.Now().Add(60 * time.Second) // a hang guard only
	for alive(kids[0]) {
		if time.Now().After(guard) {
			syscall.Kill(kids[0], syscall.SIGKILL)
			t.Fatalf("rank %d outlived its agent", kids[0])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// children lists the processes whose parent is pid.
func children(t *testing.T, pid int) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, _ := procStat(n); ppid == pid {
			out = append(out, n)
		}
	}
	return out
}

// procStat reads pid's parent and state from /proc/PID/stat.
func procStat(pid int) (ppid int, state string) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, ""
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, ""
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return 0, ""
	}
	ppid, _ = strconv.Atoi(f[1])
	return ppid, f[0]
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	_, st := procStat(pid)
	return st != "" && st != "Z"
}

func commandLease(job string, attempt uint32, steps, resume int64, script string) *pb.RankLease {
	return &pb.RankLease{JobId: job, Attempt: attempt, WorldSize: 1, LocalWorldSize: 1, GroupWorldSize: 1, MasterAddr: "127.0.0.1", MasterPort: 29500, ResumeStep: resume,
		Spec: &pb.PoolJobSpec{Id: job, Ranks: 1, TotalSteps: steps, CheckpointInterval: 4,
			Program: &pb.PoolJobSpec_Command{Command: &pb.PoolCommand{Argv: []string{"python3", script}}}}}
}

// TestCommandRankCheckpointsOnServer runs the runner's pure-Python SGD
// script as a command rank: its step directories are uploaded to the
// server, and a later attempt on a fresh worker directory resumes from the
// server's copy and ends with the same model bytes as a run never
// interrupted.
func TestCommandRankCheckpointsOnServer(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Python scripts")
	}
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3")
	}
	script, err := filepath.Abs("internal/runner/testdata/train.py")
	if err != nil {
		t.Fatal(err)
	}
	p, addr := newPool(t)
	startAgent(t, addr)
	final := func(job string, attempt uint32, step int64) []byte {
		t.Helper()
		p.waitFor(t, fmt.Sprintf("%s attempt %d to end", job, attempt), func() bool { return p.exit(job, attempt) != nil })
		p.mu.Lock()
		ex, store := p.exit(job, attempt), p.stores[job+"-0"]
		p.mu.Unlock()
		if !ex.GetCompleted() {
			t.Fatalf("%s attempt %d ended %+v, want completed", job, attempt, ex)
		}
		ck, err := checkpoint.LoadLatest(store)
		if err != nil {
			t.Fatal(err)
		}
		if ck.Step != step {
			t.Fatalf("%s: latest checkpoint on the server is of step %d, want %d", job, ck.Step, step)
		}
		for _, f := range ck.Files {
			if f.Name == "model.safetensors" {
				return f.Data
			}
		}
		t.Fatalf("%s: checkpoint without model.safetensors", job)
		return nil
	}
	p.lease(commandLease("whole", 1, 12, 0, script))
	want := final("whole", 1, 12)

	p.lease(commandLease("split", 1, 8, 0, script))
	final("split", 1, 8)
	p.lease(commandLease("split", 2, 12, 8, script))
	if got := final("split", 2, 12); string(got) != string(want) {
		t.Fatal("the resumed command's model differs from the uninterrupted run's")
	}
	if !p.logged("2/stdout: resumed step=8") || p.logged("2/stdout: step=1 ") {
		t.Fatalf("attempt 2 did not resume from step 8: %q", p.logs)
	}
	if !p.logged("2/agent: checkpoint step 12 uploaded") {
		t.Fatalf("no upload line in the log: %q", p.logs)
	}
}
