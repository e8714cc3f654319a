package coord

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/audit"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

func isDistributedDP(plan *pb.RoundPlan) bool {
	m := plan.GetDp().GetMechanism()
	return m == pb.DPMechanism_DP_MECHANISM_DISTRIBUTED_DISCRETE_GAUSSIAN || m == pb.DPMechanism_DP_MECHANISM_SKELLAM
}

// TestStrategicDropoutStopsBeforeUnmasking: in a distributed-DP task each
// device adds its share of the noise for min_noise_contributors devices. A
// hostile device takes a seat, shares its keys and then sends no masked
// input, so the sum holds fewer terms, and less noise, than promised. The
// round must stop when the masked input closes, before any honest device
// is asked for the shares that unmask the sum: before, the server ran the
// consistency and unmasking stages, the honest devices sent their shares,
// and the underprotected sum was computed before the round was abandoned.
// The abandoned round spends no ε and records no participation.
func TestStrategicDropoutStopsBeforeUnmasking(t *testing.T) {
	h := newHarness(t)
	task := h.start(h.baseTask(func(t *pb.Task) {
		t.CohortTarget, t.ReportGoal, t.RoundsTotal = 6, 3, 2
		t.Secagg = &pb.SecAggConfig{StageTimeout: durationpb.New(5 * time.Second)}
		t.Dp = &pb.DPConfig{Mechanism: pb.DPMechanism_DP_MECHANISM_DISTRIBUTED_DISCRETE_GAUSSIAN, ClipNorm: 1,
			NoiseMultiplier: 1, TargetEpsilon: 1e6, Delta: 1e-5, MinNoiseContributors: 6}
	}))
	ev := h.watch(task.Id)
	acked := make(chan string, 64)
	results := make([]<-chan error, 6)
	var plan *pb.RoundPlan
	devs := make([]*device, 6)
	for i := range 6 {
		d := h.enroll(fmt.Sprintf("dev-%d", i), 10)
		if i == 0 {
			d = h.enroll("mallory", 10)
		}
		devs[i] = d
		p := d.join()
		silent := "" // honest: the whole protocol
		if i == 0 {
			silent = "shares" // mallory vanishes once her keys are shared
		}
		if i == 1 {
			plan = p
		}
		results[i] = d.secure(p, constant(8, 0), 1, silent, acked)
	}
	if !isDistributedDP(plan) || plan.GetDp().GetMinNoiseContributors() != 6 {
		t.Fatalf("plan DP: %v", plan.GetDp())
	}
	awaitAllAcks(t, acked, map[string]int{"*fleetlearnv1.SecAggUp_Advertise": 6, "*fleetlearnv1.SecAggUp_Shares": 6})
	// Five masked inputs arrive; the sixth never does, so the stage closes
	// at its deadline.
	for _, d := range devs[1:] {
		if r := d.receipt(); !r.Accepted {
			t.Fatalf("%s: masked input refused: %s", d.id, r.Reason)
		}
	}
	h.clk.Set(plan.GetReportDeadline().AsTime().Add(-2 * 5 * time.Second))
	got := h.next(ev)
	if got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_ABANDONED ||
		!containsAll(got.Reason, "5 masked updates arrived, fewer than the distributed DP noise contributors 6", "before unmasking") {
		t.Fatalf("round: %v", got)
	}
	if <-results[0] != nil {
		t.Fatal("mallory's own run failed")
	}
	for i := 1; i < 6; i++ {
		// An honest device is told the round stopped instead of being asked
		// for the shares of mallory's mask.
		if err := <-results[i]; err == nil || !containsAll(err.Error(), "aborted", "before unmasking") {
			t.Fatalf("device %d: %v, want the round aborted before unmasking", i, err)
		}
	}
	for _, typ := range []string{"*fleetlearnv1.SecAggUp_Consistency", "*fleetlearnv1.SecAggUp_Unmask"} {
		select {
		case a := <-acked:
			if a == typ {
				t.Fatalf("a device reached %s", typ)
			}
		default:
		}
	}
	row, err := h.st.Task(t.Context(), task.Id)
	if err != nil {
		t.Fatal(err)
	}
	if row.TrainRounds != 0 || len(h.events(audit.TypePrivacySpent)) != 0 {
		t.Fatalf("abandoned round: %d training rounds, %d dp.spent events", row.TrainRounds, len(h.events(audit.TypePrivacySpent)))
	}
	if r := h.round(task.Id, 1); len(r.Participants) != 0 || r.Epsilon != 0 {
		t.Fatalf("abandoned round row: participants %v, epsilon %v", r.Participants, r.Epsilon)
	}
}
