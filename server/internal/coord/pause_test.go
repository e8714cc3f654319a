package coord

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/audit"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// shortRound lets round n of the task open, seats only the given devices
// (fewer than the report goal) and closes selection: the round is
// abandoned for want of devices.
func (h *harness) shortRound(task string, n uint64, ds ...*device) {
	h.t.Helper()
	h.awaitOpen(task, n)
	for _, d := range ds {
		d.join()
	}
	h.clk.Advance(10 * time.Second) // the selection timeout
}

// reportsShort lets round n open, seats a and b (the report goal) but only
// a reports: the round is abandoned at its deadline for want of reports,
// not of devices.
func (h *harness) reportsShort(task string, n uint64, a, b *device) {
	h.t.Helper()
	h.awaitOpen(task, n)
	a.update(a.join(), constant(8, 0.1), 5, nil)
	b.join()
	if r := a.receipt(); !r.Accepted {
		h.t.Fatalf("round %d: report refused: %s", n, r.Reason)
	}
	h.clk.Advance(10 * time.Second) // selection closes with the goal met
	h.awaitOpen(task, n)
	h.clk.Advance(20 * time.Second) // the report deadline
}

// committed lets round n open and commit with a and b (after its
// selection timeout: they are fewer than the cohort target).
func (h *harness) committed(task string, n uint64, a, b *device) {
	h.t.Helper()
	h.awaitOpen(task, n)
	for _, d := range []*device{a, b} {
		d.update(d.join(), constant(8, 0.1), 5, nil)
	}
	h.clk.Advance(10 * time.Second)
}

func (h *harness) taskRow(id string) (pb.TaskState, string, uint64, uint32) {
	h.t.Helper()
	row, err := h.st.Task(h.t.Context(), id)
	if err != nil {
		h.t.Fatal(err)
	}
	return row.State, row.Reason, row.CurrentRound, row.ShortRounds
}

// awaitStopped waits until the task has no runner.
func (h *harness) awaitStopped(id string) {
	h.t.Helper()
	h.until("the runner of "+id+" to stop", func() bool { return !h.c.Running(id) })
}

// awaitSeen waits until the store has seen n devices check in recently.
func (h *harness) awaitSeen(n int) {
	h.t.Helper()
	h.until(fmt.Sprintf("%d devices seen", n), func() bool {
		f, err := h.c.Fleet(h.t.Context())
		return err == nil && f.Seen == n
	})
}

func TestShortRoundsPauseTheTask(t *testing.T) {
	h := newHarness(t)
	a := h.enroll("dev-a", 5)
	task := h.start(h.baseTask(func(t *pb.Task) { t.RoundsTotal = 10 }))
	all := h.watchAll(task.Id)
	for n := uint64(1); n <= ShortRoundsToPause; n++ {
		if n == ShortRoundsToPause {
			h.awaitSeen(1) // the reason counts the devices seen
		}
		h.shortRound(task.Id, n, a)
	}
	want := "paused after 3 rounds in a row were abandoned for want of devices " +
		"(round 3: selection closed with 1 devices, below the report goal 2); 1 device is enrolled; " +
		"the task selects 3 per round and needs 2 reports. Resume the task (fleetlearn task resume t-test) once more devices can take a seat"
	var abandoned int
	var paused *pb.Task
	for m := range all { // the watch ends when the runner stops
		switch {
		case m.GetEvent().GetType() == pb.RoundEventType_ROUND_EVENT_TYPE_ABANDONED:
			abandoned++
		case m.GetTask() != nil:
			paused = m.GetTask()
		}
	}
	if abandoned != 3 || paused.GetState() != pb.TaskState_TASK_STATE_PAUSED || paused.GetStateReason() != want {
		t.Fatalf("watch saw %d abandoned rounds, then %v %q\nwant reason %q", abandoned, paused.GetState(), paused.GetStateReason(), want)
	}
	h.awaitStopped(task.Id)
	h.clk.Advance(time.Hour)
	if st, reason, round, _ := h.taskRow(task.Id); st != pb.TaskState_TASK_STATE_PAUSED || reason != want || round != 3 {
		t.Fatalf("task %v %q at round %d", st, reason, round)
	}
	changes := h.events(audit.TypeTaskChanged)
	if len(changes) != 1 {
		t.Fatalf("%d task.changed events, want 1", len(changes))
	}
	got := changes[0].(audit.TaskChanged)
	if got.Task != task.Id || len(got.Changes) != 2 ||
		got.Changes[0] != (audit.Change{Field: "state", Old: "running", New: "paused"}) ||
		got.Changes[1] != (audit.Change{Field: "state_reason", Old: "", New: want}) {
		t.Fatalf("task.changed = %+v", got)
	}
}

// Rounds abandoned for want of reports from a full cohort do not count
// toward a pause, and break a run of short rounds.
func TestOtherAbandonmentsDoNotPause(t *testing.T) {
	h := newHarness(t)
	a, b := h.enroll("dev-a", 5), h.enroll("dev-b", 5)
	task := h.start(h.baseTask(func(t *pb.Task) { t.RoundsTotal = 10 }))
	ev := h.watch(task.Id)
	h.shortRound(task.Id, 1, a)
	h.shortRound(task.Id, 2, a)
	h.reportsShort(task.Id, 3, a, b)
	for n := uint64(1); n <= 3; n++ {
		if got := h.next(ev); got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_ABANDONED || got.Round != n {
			t.Fatalf("round %d: %v", n, got)
		}
	}
	if r := h.round(task.Id, 3); !containsAll(r.Reason, "report deadline passed with 1 reports") {
		t.Fatalf("round 3 abandoned for %q", r.Reason)
	}
	if _, _, _, short := h.taskRow(task.Id); short != 0 {
		t.Fatalf("%d short rounds after a round with its cohort", short)
	}
	for n := uint64(4); n <= 5; n++ {
		h.shortRound(task.Id, n, a)
	}
	// b, silent in its seat at round 3, sits round 4 out (noshow.go); other
	// silent devices take the seats of rounds 6 and 7.
	h.reportsShort(task.Id, 6, a, h.enroll("dev-c", 5))
	h.reportsShort(task.Id, 7, a, h.enroll("dev-d", 5))
	h.awaitOpen(task.Id, 8)
	if st, _, _, short := h.taskRow(task.Id); st != pb.TaskState_TASK_STATE_RUNNING || short != 0 {
		t.Fatalf("task %v with %d short rounds after 2 short and 2 without reports", st, short)
	}
	h.shortRound(task.Id, 8, a)
	h.shortRound(task.Id, 9, a)
	h.shortRound(task.Id, 10, a)
	h.awaitStopped(task.Id)
	if st, _, round, _ := h.taskRow(task.Id); st != pb.TaskState_TASK_STATE_PAUSED || round != 10 {
		t.Fatalf("task %v at round %d, want paused after round 10", st, round)
	}
}

// ResumeTask reopens rounds with a fresh count; a committed round resets
// the count too.
func TestResumeReopensRounds(t *testing.T) {
	h := newHarness(t)
	a := h.enroll("dev-a", 5)
	task := h.start(h.baseTask(func(t *pb.Task) { t.RoundsTotal = 20 }))
	for n := uint64(1); n <= 3; n++ {
		h.shortRound(task.Id, n, a)
	}
	h.awaitStopped(task.Id)
	// A runner started on a task the store still has paused opens nothing.
	if err := h.c.ResumeTask(t.Context(), task.Id); err != nil {
		t.Fatal(err)
	}
	h.awaitStopped(task.Id)
	if st, _, round, _ := h.taskRow(task.Id); st != pb.TaskState_TASK_STATE_PAUSED || round != 3 {
		t.Fatalf("task %v at round %d", st, round)
	}
	if err := h.st.ResumeTask(t.Context(), task.Id, h.clk.Now()); err != nil {
		t.Fatal(err)
	}
	if err := h.c.ResumeTask(t.Context(), task.Id); err != nil {
		t.Fatal(err)
	}
	b := h.enroll("dev-b", 5)
	ev := h.watch(task.Id)
	h.shortRound(task.Id, 4, a)
	h.shortRound(task.Id, 5, a)
	h.committed(task.Id, 6, a, b)
	for n := uint64(4); n <= 6; n++ {
		want := pb.RoundEventType_ROUND_EVENT_TYPE_ABANDONED
		if n == 6 {
			want = pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED
		}
		if got := h.next(ev); got.Type != want || got.Round != n {
			t.Fatalf("round %d: %v", n, got)
		}
	}
	h.shortRound(task.Id, 7, a)
	h.shortRound(task.Id, 8, a)
	h.awaitOpen(task.Id, 9)
	if st, reason, _, short := h.taskRow(task.Id); st != pb.TaskState_TASK_STATE_RUNNING || reason != "" || short != 2 {
		t.Fatalf("task %v (%q) with %d short rounds, want running with 2", st, reason, short)
	}
}

// A paused task stays paused across restarts, and the count of short
// rounds survives one.
func TestPauseSurvivesRestart(t *testing.T) {
	h := newHarness(t)
	task := h.start(h.baseTask(func(t *pb.Task) { t.RoundsTotal = 10 }))
	h.shortRound(task.Id, 1)
	h.shortRound(task.Id, 2)
	h.awaitOpen(task.Id, 3)
	h.c.Shutdown()
	h.restart()
	h.shortRound(task.Id, 3)
	h.awaitStopped(task.Id)
	if st, _, _, _ := h.taskRow(task.Id); st != pb.TaskState_TASK_STATE_PAUSED {
		t.Fatalf("task %v after 2 short rounds, a restart and 1 more", st)
	}
	h.c.Shutdown()
	h.restart()
	h.clk.Advance(time.Hour)
	if h.c.Running(task.Id) {
		t.Fatal("a paused task runs after a restart")
	}
	if st, _, round, _ := h.taskRow(task.Id); st != pb.TaskState_TASK_STATE_PAUSED || round != 3 {
		t.Fatalf("task %v at round %d after a restart", st, round)
	}
}

func TestCohortWarnings(t *testing.T) {
	readme := &pb.Task{CohortTarget: 20, OverSelection: 0.3, ReportGoal: 16}
	small := &pb.Task{CohortTarget: 3, ReportGoal: 2, SelectionTimeout: durationpb.New(time.Minute)}
	for _, tc := range []struct {
		name  string
		task  *pb.Task
		fleet Fleet
		want  string
	}{
		{"README task on 3 devices", readme, Fleet{Registry: true, Enrolled: 3, Seen: 3},
			"3 devices are enrolled; the task selects 26 per round (cohort 20 + 30% over-selection) and needs 16 reports: " +
				"rounds will be abandoned until more devices enroll (after 3 such rounds in a row the task pauses)"},
		{"enrolled but offline", readme, Fleet{Registry: true, Enrolled: 30, Seen: 5},
			"30 devices are enrolled, 5 of them checked in within the last 10m0s; the task selects 26 per round " +
				"(cohort 20 + 30% over-selection) and needs 16 reports: rounds will be abandoned until more of them check in " +
				"(after 3 such rounds in a row the task pauses)"},
		{"no registry", small, Fleet{Seen: 1},
			"1 device checked in within the last 10m0s; the task selects 3 per round and needs 2 reports: " +
				"rounds will be abandoned until more devices check in (after 3 such rounds in a row the task pauses)"},
		{"fewer than the cohort", readme, Fleet{Registry: true, Enrolled: 18, Seen: 18},
			"18 devices are enrolled; the task selects 26 per round (cohort 20 + 30% over-selection): " +
				"each round waits out its 30s selection timeout and runs with at most 18 devices"},
		// Selection closes once the cohort target has seats: the spare
		// seats of over-selection need no devices.
		{"the cohort, not the over-selection", readme, Fleet{Registry: true, Enrolled: 20, Seen: 20}, ""},
		{"enough", readme, Fleet{Registry: true, Enrolled: 26, Seen: 26}, ""},
		{"enough, some offline", small, Fleet{Registry: true, Enrolled: 9, Seen: 3}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := CohortWarnings(tc.task, tc.fleet)
			if tc.want == "" {
				if len(got) != 0 {
					t.Fatalf("warnings %q, want none", got)
				}
				return
			}
			if len(got) != 1 || got[0] != tc.want {
				t.Fatalf("warnings %q\nwant %q", got, tc.want)
			}
		})
	}
}

// Fleet counts enrolled devices, and of them those seen within SeenWindow
// of the coordinator's clock.
func TestFleetCountsRecentCheckIns(t *testing.T) {
	h := newHarness(t)
	a := h.enroll("dev-a", 5)
	h.enroll("dev-b", 5)
	a.checkIn()
	h.awaitSeen(1)
	f, err := h.c.Fleet(t.Context())
	if err != nil || f != (Fleet{Registry: true, Enrolled: 2, Seen: 1}) {
		t.Fatalf("fleet %+v %v", f, err)
	}
	h.clk.Advance(SeenWindow + time.Second)
	h.awaitSeen(0)
}
