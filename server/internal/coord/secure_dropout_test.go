package coord

import (
	"testing"
	"time"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// TestSecureRoundBelowGoalNotUnmasked: two of six devices vanish after
// sharing their keys (or a server would say so of two honest ones), so
// four masked updates arrive against a report goal of five. The round is
// abandoned when the masked input closes, before any device is shown a
// survivor set or asked for a share: nobody helps unmask a sum of fewer
// inputs than the task asks for. (Before, it unmasked and committed the
// four.)
func TestSecureRoundBelowGoalNotUnmasked(t *testing.T) {
	h := newHarness(t)
	spec := secureTask(h)
	spec.ReportGoal = 5
	task := h.start(spec)
	ev := h.watch(task.Id)
	devs, plans := h.joinCohort(6)
	silent := []string{"shares", "shares", "", "", "", ""}
	acked := make(chan string, 64)
	results := make([]<-chan error, 6)
	for i, d := range devs {
		results[i] = d.secure(plans[i], constant(8, 0.1), 1, silent[i], acked)
	}
	awaitAllAcks(t, acked, map[string]int{"*fleetlearnv1.SecAggUp_Advertise": 6, "*fleetlearnv1.SecAggUp_Shares": 6})
	for _, d := range devs[2:] {
		if r := d.receipt(); !r.Accepted {
			t.Fatalf("%s: masked input refused: %s", d.id, r.Reason)
		}
	}
	stage := 5 * time.Second
	h.clk.Set(plans[2].GetReportDeadline().AsTime().Add(-2 * stage))
	got := h.next(ev)
	if got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_ABANDONED ||
		!containsAll(got.Reason, "4 masked updates", "report goal 5", "before unmasking") {
		t.Fatalf("round with 4 of 5 masked updates: %v", got)
	}
	for i, r := range results[2:] {
		if err := <-r; err == nil || !containsAll(err.Error(), "aborted") {
			t.Fatalf("device %d: %v", i+2, err)
		}
	}
	for len(acked) > 0 {
		if a := <-acked; a != "*fleetlearnv1.SecAggUp_Advertise" && a != "*fleetlearnv1.SecAggUp_Shares" {
			t.Fatalf("a device sent %s in a round abandoned before its survivor set", a)
		}
	}
}
