package crossarch_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/data/datatest"
	"github.com/fleetlearn/fleetlearn/model/sgd"
	"github.com/fleetlearn/fleetlearn/model/train"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm"
	"github.com/fleetlearn/fleetlearn/wasm/examples/embedded"
)

// target is one platform the agent is released for, and the qemu-user
// emulator that runs it here.
type target struct {
	platform string   // as deploy/release -platforms names it
	dir      string   // its directory in dist
	qemu     []string // the emulator's names, preferred first
	engine   string   // the wazero engine the agent must run there
}

var targets = []target{
	// wazero compiles to arm64 machine code, which qemu translates again.
	{"linux/arm64", "linux-arm64", []string{"qemu-aarch64-static", "qemu-aarch64"}, wasm.EngineCompiler},
	// No compiler for 32-bit arm: the interpreter, which a sandbox that
	// always asked for the compiler made panic.
	{"linux/arm/v7", "linux-armv7", []string{"qemu-arm-static", "qemu-arm"}, wasm.EngineInterpreter},
}

// The stamps the test builds with, which `version` must print.
const (
	stampVersion = "v0.0.0-crossarch"
	stampCommit  = "c0ffee0123456789abcdefc0ffee0123456789ab"
	stampTime    = "2025-01-02T03:04:05Z"
)

// TestAgentUnderQEMU: the release build of fleetlearn-edge for arm64 and
// for ARMv7, each run under qemu-user, prints its stamped version and
// engine, enrolls with a real server (servertest: embedded NATS, SQLite,
// TLS API), trains the embedded softmax example module on a small
// dataset and sends a report that commits the task's round.
//
// Emulation makes the agent tens of times slower than native, and a
// loaded machine slower still, so nothing here waits on wall time: the
// task's selection and report timeouts and the module's call limit are
// far beyond any run, the test waits for the round's COMMITTED event on
// the server's watch stream, and it fails early if the agent exits. Only
// go test's own -timeout bounds it.
func TestAgentUnderQEMU(t *testing.T) {
	if testing.Short() {
		t.Skip("cross-compiles the agent and runs it under qemu-user for minutes")
	}
	emulators := map[string]string{}
	for _, tg := range targets {
		emulators[tg.platform] = findQEMU(t, tg)
	}
	dist := releaseBuild(t)
	t.Logf("server (in process, %s/%s): wasm %s", runtime.GOOS, runtime.GOARCH, wasm.Engine())
	for _, tg := range targets {
		t.Run(strings.ReplaceAll(tg.platform, "/", "-"), func(t *testing.T) {
			runTarget(t, tg, emulators[tg.platform], filepath.Join(dist, tg.dir, "fleetlearn-edge"))
		})
	}
}

// findQEMU returns the path of tg's emulator. Without one the test skips,
// saying what to install; under CI (CI=true) it fails instead, since CI
// installs qemu-user-static (.ci/run) and a skip there would hide a
// broken arm build.
func findQEMU(t *testing.T, tg target) string {
	t.Helper()
	for _, name := range tg.qemu {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := fmt.Sprintf("%s not found on PATH: the %s agent runs under qemu-user; install it with "+
		"'apt-get install qemu-user-static' (Debian, Ubuntu)", tg.qemu[0], tg.platform)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg + " (CI=true: .ci/run installs it, so its absence is a failure)")
	}
	t.Skip(msg)
	return ""
}

// releaseBuild builds fleetlearn-edge for the targets with the release
// tool, as a release would, and returns its dist directory.
func releaseBuild(t *testing.T) string {
	t.Helper()
	dist := t.TempDir()
	var ps []string
	for _, tg := range targets {
		ps = append(ps, tg.platform)
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "run", "./deploy/release", "-dist", dist,
		"-platforms", strings.Join(ps, ","), "-cmds", "fleetlearn-edge",
		"-version", stampVersion, "-commit", stampCommit, "-commit-time", stampTime)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go run ./deploy/release: %v\n%s", err, out)
	}
	t.Logf("release build (%v):\n%s", time.Since(start).Round(time.Second), strings.TrimSpace(string(out)))
	return dist
}

// runTarget enrolls and runs the agent for tg under qemu and waits for
// its round to commit.
func runTarget(t *testing.T, tg target, qemu, bin string) {
	ctx := t.Context()
	if dl, ok := t.Deadline(); ok {
		// Leave time to stop the agent and print its log before go test
		// panics.
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, dl.Add(-time.Minute))
		defer cancel()
	}

	// The stamps and the engine, from the binary itself.
	out, err := exec.CommandContext(ctx, qemu, bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s version: %v\n%s", filepath.Base(qemu), bin, err, out)
	}
	line := strings.TrimSpace(string(out))
	t.Logf("%s version: %s", tg.platform, line)
	for _, want := range []string{"fleetlearn-edge " + stampVersion + ", commit " + stampCommit[:12] + ", ",
		", " + tg.platform + ", ", ", wasm " + tg.engine + ", "} {
		if !strings.Contains(line, want) {
			t.Errorf("version printed %q, want %q in it", line, want)
		}
	}

	h := servertest.New(t)
	work := t.TempDir()
	ca := filepath.Join(work, "ca.crt")
	if err := os.WriteFile(ca, h.CACertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	tok, err := h.Devices.CreateEnrollmentToken(ctx, &pb.CreateEnrollmentTokenRequest{})
	if err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(work, "token")
	if err := os.WriteFile(tokenFile, []byte(tok.GetToken()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	state, dataset := filepath.Join(work, "state"), filepath.Join(work, "dataset")
	device := "qemu-" + strings.ReplaceAll(strings.TrimPrefix(tg.platform, "linux/"), "/", "")
	start := time.Now()
	if out, err := exec.CommandContext(ctx, qemu, bin, "enroll", "--api", h.GRPCAddr(), "--ca", ca, "--token-file", tokenFile,
		"--data-dir", state, "--device-id", device).CombinedOutput(); err != nil {
		t.Fatalf("fleetlearn-edge enroll under %s: %v\n%s", filepath.Base(qemu), err, out)
	}
	t.Logf("%s enrolled as %s in %v", tg.platform, device, time.Since(start).Round(100*time.Millisecond))

	// 48 examples of 8 features in 3 classes: a few batches, enough to
	// train, little for an emulated interpreter.
	if err := data.WriteDir(dataset, datatest.Synthetic(48, 8, 3, 7), "qemu"); err != nil {
		t.Fatal(err)
	}
	mod, err := embedded.Lookup("softmax")
	if err != nil {
		t.Fatal(err)
	}
	code, err := mod.Code()
	if err != nil {
		t.Fatal(err)
	}
	module := h.RegisterModule(t, "softmax", code)
	init, err := train.InitMLP([]int{8, 3}, 1)
	if err != nil {
		t.Fatal(err)
	}
	version := h.ImportModel(t, "base", init)
	hyper, err := json.Marshal(sgd.Hyper{Epochs: 1, BatchSize: 16, LearningRate: 0.5, EvalBatchSize: 48})
	if err != nil {
		t.Fatal(err)
	}
	// Generous, not tight: an emulated device is slow, and these only
	// stop a round that would otherwise never end.
	const generous = 6 * time.Hour
	task := h.CreateTask(t, &pb.Task{Name: "qemu-" + tg.dir, Model: &pb.ModelRef{Version: version}, Module: &pb.ModuleRef{Sha256: module},
		Hyperparameters: hyper, CohortTarget: 1, ReportGoal: 1, RoundsTotal: 1,
		SelectionTimeout: durationpb.New(generous), ReportTimeout: durationpb.New(generous),
		Limits: &pb.Limits{Timeout: durationpb.New(generous)}})
	events := watch(ctx, t, h, task.GetId())

	agent := startAgent(ctx, t, qemu, bin, "--data-dir", state, "--dataset", dataset, "--log-level", "debug")
wait:
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				// The task finished before the watch began, or the watch
				// broke: the rounds below say which.
				break wait
			}
			switch ev.GetType() {
			case pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED:
				break wait
			case pb.RoundEventType_ROUND_EVENT_TYPE_ABANDONED:
				t.Fatalf("round %d abandoned: %s\n%s", ev.GetRound(), ev.GetReason(), agent.tail())
			}
		case <-agent.exited:
			t.Fatalf("the agent exited before its round committed: %v\n%s", agent.err, agent.tail())
		case <-ctx.Done():
			t.Fatalf("round 1 has not committed by go test's deadline\n%s", agent.tail())
		}
	}
	rounds := h.Rounds(t, task.GetId())
	if len(rounds) != 1 || rounds[0].GetState() != pb.RoundState_ROUND_STATE_COMMITTED {
		t.Fatalf("rounds %v, want round 1 committed\n%s", rounds, agent.tail())
	}
	r := rounds[0]
	if r.GetAssigned() != 1 || r.GetReported() != 1 || r.GetModel().GetVersion() == "" {
		t.Fatalf("round 1 committed with %d assigned, %d reports and model %q; want the agent's one report and a new model",
			r.GetAssigned(), r.GetReported(), r.GetModel().GetVersion())
	}
	done := h.WaitTask(t, task.GetId(), time.Minute, pb.TaskState_TASK_STATE_COMPLETED, pb.TaskState_TASK_STATE_FAILED)
	if done.GetState() != pb.TaskState_TASK_STATE_COMPLETED {
		t.Fatalf("task %v: %s", done.GetState(), done.GetStateReason())
	}
	agent.stop()

	// The agent's own first line names its build and engine.
	log := agent.log()
	m := regexp.MustCompile(`msg=starting version="([^"]*)"`).FindStringSubmatch(log)
	if m == nil || m[1] != line {
		t.Errorf("the agent did not log its version line %q at start\n%s", line, agent.tail())
	}
	var metrics []string
	for k, v := range r.GetMetrics().GetValues() {
		metrics = append(metrics, fmt.Sprintf("%s=%.4g", k, v))
	}
	slices.Sort(metrics)
	// The round opens before the agent starts: its time is the agent's
	// start, check-in, download, module compilation, training and report.
	roundTime := r.GetCloseTime().AsTime().Sub(r.GetOpenTime().AsTime())
	t.Logf("%s agent under %s (wasm %s): round 1 committed with %d report (%s); round open to close %v on the server's clock",
		tg.platform, filepath.Base(qemu), tg.engine, r.GetReported(), strings.Join(metrics, " "), roundTime.Round(10*time.Millisecond))
}

// watch streams the task's round events until ctx ends or the stream
// does.
func watch(ctx context.Context, t *testing.T, h *servertest.Harness, id string) <-chan *pb.RoundEvent {
	t.Helper()
	st, err := h.Tasks.WatchTask(ctx, &pb.WatchTaskRequest{TaskId: id})
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan *pb.RoundEvent, 16)
	go func() {
		defer close(ch)
		for {
			m, err := st.Recv()
			if err != nil {
				return
			}
			if ev := m.GetEvent(); ev != nil {
				select {
				case ch <- ev:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return ch
}

// agentProc is the agent under qemu, its output in a file.
type agentProc struct {
	cmd     *exec.Cmd
	logPath string
	exited  chan struct{}
	err     error // set before exited closes
	once    sync.Once
}

func startAgent(ctx context.Context, t *testing.T, qemu, bin string, args ...string) *agentProc {
	t.Helper()
	a := &agentProc{logPath: filepath.Join(t.TempDir(), "agent.log"), exited: make(chan struct{})}
	f, err := os.Create(a.logPath)
	if err != nil {
		t.Fatal(err)
	}
	a.cmd = exec.Command(qemu, append([]string{bin}, args...)...)
	a.cmd.Stdout, a.cmd.Stderr = f, f
	if err := a.cmd.Start(); err != nil {
		f.Close()
		t.Fatal(err)
	}
	go func() {
		a.err = a.cmd.Wait()
		f.Close()
		close(a.exited)
	}()
	// qemu-user hands SIGTERM to the emulated agent, which stops cleanly.
	t.Cleanup(a.stop)
	go func() {
		select {
		case <-ctx.Done():
			a.stop()
		case <-a.exited:
		}
	}()
	return a
}

// stop sends SIGTERM and waits for the agent to exit; SIGKILL if it has
// not after a minute (a hung emulator must not hang the test run).
func (a *agentProc) stop() {
	a.once.Do(func() {
		a.cmd.Process.Signal(syscall.SIGTERM)
		timer := time.NewTimer(time.Minute)
		defer timer.Stop()
		select {
		case <-a.exited:
		case <-timer.C:
			a.cmd.Process.Kill()
			<-a.exited
		}
	})
}

func (a *agentProc) log() string {
	b, err := os.ReadFile(a.logPath)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err.Error()
	}
	return string(b)
}

// tail is the end of the agent's log, for failures.
func (a *agentProc) tail() string {
	l := a.log()
	if len(l) > 6000 {
		l = "…" + l[len(l)-6000:]
	}
	return "--- agent log (tail):\n" + l
}
