package server_test

import (
	"bufio"
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/data/datatest"
	"github.com/fleetlearn/fleetlearn/model/train"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// scrape reads /metrics over HTTP into series (name{labels} as the text
// format writes them) and values.
func scrape(t testing.TB, h *servertest.Harness) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + h.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %s", resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("/metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// series looks a series up, failing the test when it is missing.
func series(t testing.TB, m map[string]float64, s string) float64 {
	t.Helper()
	v, ok := m[s]
	if !ok {
		t.Fatalf("/metrics has no series %s", s)
	}
	return v
}

// TestMetricsScrape: three enrolled agents commit a round, then leave; the
// task's next rounds are abandoned for want of devices until the
// coordinator pauses it. /metrics then shows the fleet, the paused task's
// round as the API reports it, a stray report's refusal under its reason, a
// revocation and the pool's (empty) series.
func TestMetricsScrape(t *testing.T) {
	if testing.Short() {
		t.Skip("rounds with real agents and a pause after three short rounds")
	}
	h := servertest.New(t)
	init, _ := train.InitMLP([]int{8, 3}, 1)
	version := h.ImportModel(t, "synthetic", init)
	module := h.RegisterModule(t, "softmax", wasmtest.Build(t, wasmtest.Softmax))
	stray := newScripted(t, h, "stray-1") // enrolled, never checks in
	f := startFleet(t, h, 3, func(i int) *data.Dataset { return datatest.Synthetic(100, 8, 3, uint64(i+1)) })
	// More rounds than the fleet can commit before it leaves: rounds are
	// quick, and a few may commit between the first and the fleet's stop.
	spec := baseTask("metrics", version, module, 20)
	spec.CohortTarget, spec.OverSelection, spec.ReportGoal = 3, 0, 3
	// Short selection windows: the rounds after the fleet leaves are
	// abandoned quickly, and the third pauses the task.
	spec.SelectionTimeout = durationpb.New(2 * time.Second)
	task := h.CreateTask(t, spec)

	ctx := context.Background()
	end := time.Now().Add(60 * time.Second) // hang guard
	for committed := false; !committed; {
		if time.Now().After(end) {
			t.Fatal("no round committed within 60s")
		}
		for _, r := range h.Rounds(t, task.Id) {
			committed = committed || r.State == pb.RoundState_ROUND_STATE_COMMITTED
		}
		time.Sleep(50 * time.Millisecond)
	}
	f.stop()
	paused := h.WaitTask(t, task.Id, 90*time.Second, pb.TaskState_TASK_STATE_PAUSED, pb.TaskState_TASK_STATE_FAILED)
	if paused.State != pb.TaskState_TASK_STATE_PAUSED {
		t.Fatalf("task %v: %s", paused.State, paused.StateReason)
	}

	m := scrape(t, h)
	got, err := h.Tasks.GetTask(ctx, &pb.GetTaskRequest{TaskId: task.Id})
	if err != nil {
		t.Fatal(err)
	}
	if r := series(t, m, `fleetlearn_task_round{task="`+task.Id+`"}`); r != float64(got.Task.CurrentRound) || r < 2 {
		t.Errorf("fleetlearn_task_round %v, the API's current_round %d (want at least 2)", r, got.Task.CurrentRound)
	}
	if v := series(t, m, `fleetlearn_task_rounds_target{task="`+task.Id+`"}`); v != 20 {
		t.Errorf("fleetlearn_task_rounds_target %v, want 20", v)
	}
	committed := 0
	for _, r := range h.Rounds(t, task.Id) {
		if r.State == pb.RoundState_ROUND_STATE_COMMITTED {
			committed++
		}
	}
	if v := series(t, m, `fleetlearn_task_train_rounds{task="`+task.Id+`"}`); v != float64(committed) || committed < 1 {
		t.Errorf("fleetlearn_task_train_rounds %v, the API's committed rounds %d (want at least 1)", v, committed)
	}
	if v := series(t, m, `fleetlearn_tasks{state="paused"}`); v != 1 {
		t.Errorf(`fleetlearn_tasks{state="paused"} %v, want 1`, v)
	}
	if v := series(t, m, `fleetlearn_rounds_total{kind="train",outcome="abandoned"}`); v < 3 {
		t.Errorf("%v rounds abandoned, want at least the 3 that paused the task", v)
	}
	if v := series(t, m, `fleetlearn_devices{state="enrolled"}`); v != 4 {
		t.Errorf("%v devices enrolled, want 4 (three agents and the stray)", v)
	}
	if v := series(t, m, `fleetlearn_devices{state="online"}`); v != 3 {
		t.Errorf("%v devices online, want the 3 agents that checked in", v)
	}
	if v := series(t, m, `fleetlearn_devices{state="revoked"}`); v != 0 {
		t.Errorf("%v devices revoked, want 0", v)
	}
	for _, s := range []string{`fleetlearn_pool_workers{state="ready"}`, `fleetlearn_pool_jobs{state="queued",tenant="default"}`} {
		if v := series(t, m, s); v != 0 {
			t.Errorf("%s %v, want 0", s, v)
		}
	}

	// The task has no open round, so the stray's report is refused as not open.
	notOpen := `fleetlearn_report_refusals_total{reason="not_open"}`
	before := series(t, m, notOpen)
	stray.refused(t, wire.ReportSubject(task.Id, got.Task.CurrentRound+1, stray.id), []byte("x"), task.Id, got.Task.CurrentRound+1, "no open round")
	if _, err := h.Devices.RevokeDevice(ctx, &pb.RevokeDeviceRequest{DeviceId: stray.id, Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	m = scrape(t, h)
	if v := series(t, m, notOpen); v != before+1 {
		t.Errorf("%s %v after the stray report, want %v", notOpen, v, before+1)
	}
	if v := series(t, m, `fleetlearn_report_refusals_total{reason="signature"}`); v != 0 {
		t.Errorf("%v reports refused for their signature, want 0", v)
	}
	if e, r := series(t, m, `fleetlearn_devices{state="enrolled"}`), series(t, m, `fleetlearn_devices{state="revoked"}`); e != 3 || r != 1 {
		t.Errorf("after a revocation %v enrolled, %v revoked; want 3 and 1", e, r)
	}
}
