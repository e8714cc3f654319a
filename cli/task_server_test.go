package cli_test

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/fleetlearn/fleetlearn/cli"
	"github.com/fleetlearn/fleetlearn/internal/simfleet"
	"github.com/fleetlearn/fleetlearn/model"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// The tests in this file run the task and model commands against a real
// server (package servertest) with simulated devices (internal/simfleet).

// tinyModel is a four-parameter model; start makes each version distinct.
func tinyModel(t *testing.T, start float32) *model.Model {
	t.Helper()
	m, err := model.New(model.Tensor{Name: "w", Shape: []int{4}, Data: []float32{start, 0, 0, 0}})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// simFleet enrolls n simulated devices that report a small update to
// tinyModel.
func simFleet(t *testing.T, h *servertest.Harness, n int) simfleet.Config {
	t.Helper()
	cfg := simfleet.Config{NATSURL: h.NATSURL(), NATSOptions: h.ServiceNATSOptions(), Devices: n,
		Layout: []*pb.TensorSpec{{Name: "w", Shape: []uint64{4}}}, Delta: []float32{1e-3, 1e-3, 1e-3, 1e-3}}
	cfg.Keys = h.EnrollKeys(t, cfg.DeviceIDs())
	return cfg
}

// startSimFleet runs the devices until the test ends (or Stop).
func startSimFleet(t *testing.T, cfg simfleet.Config) *simfleet.Fleet {
	t.Helper()
	fleet, err := simfleet.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fleet.Stop)
	return fleet
}

// createTask creates a task through the CLI, as an operator would, and
// returns its id.
func createTask(t *testing.T, h *servertest.Harness, args ...string) string {
	t.Helper()
	out, err := runServer(t, h, append([]string{"task", "create", "-o", "json"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	var task pb.Task
	if err := protojson.Unmarshal([]byte(out), &task); err != nil || task.GetId() == "" {
		t.Fatalf("task create printed no task (%v):\n%s", err, out)
	}
	return task.GetId()
}

// TestTaskCreateModelRefsServer: task create takes NAME@N, NAME and a
// sha256 prefix for --model and sends the version they name; model list
// numbers the versions the same way.
func TestTaskCreateModelRefsServer(t *testing.T) {
	h := servertest.New(t)
	first := h.ImportModel(t, "mnist", tinyModel(t, 1))
	second := h.ImportModel(t, "mnist", tinyModel(t, 2))
	h.ImportModel(t, "other", tinyModel(t, 3))
	module := h.RegisterModule(t, "trivial", wasmtest.Trivial())
	for ref, want := range map[string]string{"mnist@1": first, "mnist@2": second, "mnist": second, first[:12]: first} {
		id := createTask(t, h, "--name", "ft", "--model", ref, "--module", module, "--cohort", "1", "--rounds", "1")
		res, err := h.Tasks.GetTask(t.Context(), &pb.GetTaskRequest{TaskId: id})
		if err != nil {
			t.Fatal(err)
		}
		if got := res.GetTask().GetModel().GetVersion(); got != want {
			t.Errorf("--model %s: the task starts from %s, want %s", ref, got, want)
		}
	}
	for ref, want := range map[string]string{
		"mnist@3": "--model: mnist has 2 versions; mnist@3 does not exist",
		"cifar":   "--model: no model named cifar; fleetlearn model list shows the models",
	} {
		_, err := runServer(t, h, "task", "create", "--name", "ft", "--model", ref, "--module", module)
		if !errors.Is(err, cli.ErrUnknownModel) || err.Error() != want {
			t.Errorf("--model %s: %v, want %q", ref, err, want)
		}
	}

	out, err := runServer(t, h, "model", "list")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"mnist@2  " + second, "mnist@1  " + first, "other@1  "} {
		if !strings.Contains(out, s) {
			t.Errorf("model list lacks %q:\n%s", s, out)
		}
	}
}

// TestWatchServer: a task with an evaluation round after every training
// round. watch counts only the training rounds, shows the evaluation
// rounds as such, and ends with the training rounds done; task rounds
// shows the rounds' metrics in columns of their own.
func TestWatchServer(t *testing.T) {
	h := servertest.New(t)
	base := h.ImportModel(t, "tiny", tinyModel(t, 1))
	module := h.RegisterModule(t, "trivial", wasmtest.Trivial())
	startSimFleet(t, simFleet(t, h, 2))
	id := createTask(t, h, "--name", "evaluated", "--model", "tiny", "--module", module, "--cohort", "2",
		"--over-selection", "1", "--rounds", "2", "--eval-every", "1")

	out, err := runServer(t, h, "task", "watch", id)
	if err != nil {
		t.Fatalf("watch: %v\n%s", err, out)
	}
	finals := finishedLines(out)
	want := []string{
		`^round 1 train 1/2 committed \[#{10}-{10}\] 2/2 reported, 0 dropped  model [0-9a-f]{12}  \(cohort target 2 reached\)$`,
		`^round 2 evaluate committed \[#{10}-{10}\] 2/2 reported, 0 dropped  eval_accuracy=0  \(cohort target 2 reached\)$`,
		`^round 3 train 2/2 committed \[#{20}\] 2/2 reported, 0 dropped  model [0-9a-f]{12}  \(cohort target 2 reached\)$`,
		`^round 4 evaluate committed \[#{20}\] 2/2 reported, 0 dropped  eval_accuracy=0  \(cohort target 2 reached\)$`,
		`^task ` + id + ` completed after 2/2 training rounds, model [0-9a-f]{12} \(all rounds committed\)$`,
		`^final model [0-9a-f]{12}: eval_accuracy=0$`,
	}
	if len(finals) != len(want) {
		t.Fatalf("watch printed:\n%s\nwant lines matching:\n%s", out, strings.Join(want, "\n"))
	}
	for i, w := range want {
		if !regexp.MustCompile(w).MatchString(finals[i]) {
			t.Errorf("line %d = %q, want %s", i, finals[i], w)
		}
	}
	task, err := h.Tasks.GetTask(t.Context(), &pb.GetTaskRequest{TaskId: id})
	if err != nil {
		t.Fatal(err)
	}
	if final := task.GetTask().GetCurrentModel().GetVersion(); final == base || !strings.Contains(out, "model "+final[:12]+" (") {
		t.Errorf("the completion line does not name the final model %s:\n%s", final, out)
	}

	out, err = runServer(t, h, "task", "rounds", id)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 5 || strings.Join(strings.Fields(lines[0]), " ") !=
		"ROUND KIND STATE ASSIGNED REPORTED DROPPED FAILURES EPSILON EVAL_ACCURACY MODEL REASON" ||
		!strings.HasPrefix(lines[1], "4 ") || !strings.Contains(lines[1], "evaluate") || strings.Fields(lines[1])[8] != "0" ||
		!strings.HasPrefix(lines[4], "1 ") || strings.Fields(lines[4])[8] != "-" || !regexp.MustCompile(`^[0-9a-f]{12}$`).MatchString(strings.Fields(lines[4])[9]) {
		t.Errorf("task rounds:\n%s", out)
	}
	out, err = runServer(t, h, "task", "get", id)
	if err != nil || !regexp.MustCompile(`(?m)^TRAINED +2/2 rounds$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^ROUND +4$`).MatchString(out) {
		t.Errorf("task get: %v\n%s", err, out)
	}
}

// finishedLines drops the lines of rounds still running (opened, closed):
// when a watch sees them depends on timing.
func finishedLines(out string) []string {
	var keep []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if !strings.Contains(l, " opened [") && !strings.Contains(l, " closed [") {
			keep = append(keep, l)
		}
	}
	return keep
}

// TestWatchAttachesMidTask: a watch that begins after rounds finished shows
// them first, each once, then follows the rest.
func TestWatchAttachesMidTask(t *testing.T) {
	h := servertest.New(t)
	h.ImportModel(t, "tiny", tinyModel(t, 1))
	module := h.RegisterModule(t, "trivial", wasmtest.Trivial())
	devices := simFleet(t, h, 2)
	fleet := startSimFleet(t, devices)
	// A long selection window: while no device is online, the open round
	// waits rather than being abandoned; back online, devices already in
	// its cohort get their plans again.
	id := createTask(t, h, "--name", "late", "--model", "tiny", "--module", module, "--cohort", "2",
		"--over-selection", "1", "--rounds", "4", "--selection-timeout", "10m")
	waitCommitted(t, h, id, 2)
	fleet.Stop()

	out := &lockedBuffer{}
	done := make(chan error, 1)
	go func() { done <- watchTo(t, h, out, id) }()
	// The earlier rounds are on screen before anything else happens.
	waitFor(t, func() bool { return strings.Contains(out.String(), "round 2 train 2/4 committed") })
	startSimFleet(t, devices)
	if err := <-done; err != nil {
		t.Fatalf("watch: %v\n%s", err, out)
	}
	t.Logf("watch:\n%s", out)
	lines := finishedLines(out.String())
	if len(lines) != 5 || !strings.HasPrefix(lines[4], "task "+id+" completed after 4/4 training rounds") {
		t.Fatalf("watch printed:\n%s", out)
	}
	for i := range 4 {
		if want := fmt.Sprintf("round %d train %d/4 committed", i+1, i+1); !strings.HasPrefix(lines[i], want) {
			t.Errorf("line %d = %q, want %q...", i, lines[i], want)
		}
	}
}

// watchTo runs task watch against h, writing to w.
func watchTo(t *testing.T, h *servertest.Harness, w *lockedBuffer, id string) error {
	root := cli.NewRootCommand(cli.WithGetenv(func(string) string { return "" }), cli.WithTerminal(false))
	root.SetOut(w)
	root.SetErr(w)
	root.SetArgs([]string{"--timeout", "0", "--server", h.GRPCAddr(), "--ca", server.CAFile(h.Dir),
		"--token-file", server.AdminTokenPath(h.Dir), "task", "watch", id})
	return root.ExecuteContext(t.Context())
}

// lockedBuffer is a buffer a running command writes while the test reads.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// waitCommitted waits until n of the task's training rounds committed.
func waitCommitted(t *testing.T, h *servertest.Harness, id string, n int) {
	t.Helper()
	waitFor(t, func() bool {
		c := 0
		for _, r := range h.Rounds(t, id) {
			if r.GetKind() == pb.RoundKind_ROUND_KIND_TRAIN && r.GetState() == pb.RoundState_ROUND_STATE_COMMITTED {
				c++
			}
		}
		return c >= n
	})
}

// waitFor polls cond until it holds; a hang ends with the test binary's
// timeout, which a loaded machine cannot make fail early.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-t.Context().Done():
			t.Fatal("gave up waiting")
		case <-time.After(20 * time.Millisecond):
		}
	}
}
