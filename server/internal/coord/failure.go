package coord

import (
	"fmt"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/round"
)

// handleFailure records a device's report that it could not carry out its
// plan, so the round can say why the device dropped. The subject names the
// device (only it may publish there); the failure counts only for the open
// round whose cohort holds the device, once, and only until it reports.
func (c *Coordinator) handleFailure(m *nats.Msg) {
	reply := func(reason string) {
		b, _ := proto.Marshal(&pb.PlanFailureAck{Accepted: reason == "", Reason: reason})
		m.Respond(b)
	}
	task, rnd, device, err := wire.ParseFailureSubject(m.Subject)
	if err != nil {
		reply(err.Error())
		return
	}
	if why := round.CheckFailure(round.Failure{Size: len(m.Data)}); why != "" {
		reply(why)
		return
	}
	var f pb.PlanFailure
	if err := proto.Unmarshal(m.Data, &f); err != nil {
		reply("malformed failure report: " + err.Error())
		return
	}
	if why := round.CheckFailure(round.Failure{Size: len(m.Data), SubjectTask: task, BodyTask: f.TaskId,
		SubjectRound: rnd, BodyRound: f.Round, SubjectDevice: device, BodyDevice: f.DeviceId}); why != "" {
		reply(why)
		return
	}
	c.mu.Lock()
	async := c.tasks[task]
	c.mu.Unlock()
	if async != nil && async.isAsync() {
		if !async.asyncFailure(rnd, device) {
			reply(fmt.Sprintf("device %q holds no seat on round %d of task %q", device, rnd, task))
			return
		}
		c.d.Metrics.PlanFailures.Inc()
		async.log().Info("device could not carry out its plan; its seat is free", "round", rnd, "device", device, "reason", f.Reason)
		reply("")
		return
	}
	tr, r := c.openRound(task, rnd)
	if r == nil {
		reply(fmt.Sprintf("round %d of task %q is not open", rnd, task))
		return
	}
	why := fmt.Sprintf("device failed after %d attempts: %s", f.Attempts, f.Reason)
	if !tr.noteFailure(r, device, why) {
		reply(fmt.Sprintf("device %q is not in the cohort of round %d, or its failure is already recorded", device, rnd))
		return
	}
	c.d.Metrics.PlanFailures.Inc()
	tr.log().Info("device could not carry out its plan", "round", rnd, "device", device, "reason", why)
	reply("")
}

// openRound returns the runner of task and its round, if that round is
// the one open; nil otherwise.
func (c *Coordinator) openRound(task string, round uint64) (*taskRun, *roundRun) {
	c.mu.Lock()
	tr := c.tasks[task]
	c.mu.Unlock()
	if tr == nil {
		return nil, nil
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if r := tr.round; r != nil && r.row.Round == round {
		return tr, r
	}
	return nil, nil
}

// noteFailure keeps why a cohort device has not contributed, the first
// reason only; it reports whether the reason was kept.
func (t *taskRun) noteFailure(r *roundRun, device, why string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return r.cohort.Fail(device, wire.FailureReason(why))
}
