package coord

import (
	"crypto/ed25519"
	crand "crypto/rand"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/clock"
	"github.com/fleetlearn/fleetlearn/internal/testwait"
	"github.com/fleetlearn/fleetlearn/privacy/secagg"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/privacyconf"
	"github.com/fleetlearn/fleetlearn/proto/wire"
)

// secureDevice runs the device side of a secure round with the secagg
// client, as an agent does, except that it can be told to go silent after
// a stage. It reports what ended its round on done.
// Each stage message the server accepted is reported on acked.
func (d *device) secure(plan *pb.RoundPlan, delta []float32, weight float64, silentAfter string, acked chan<- string) <-chan error {
	done := make(chan error, 1)
	go func() { done <- d.runSecure(plan, delta, weight, silentAfter, acked) }()
	return done
}

func (d *device) runSecure(plan *pb.RoundPlan, delta []float32, weight float64, silentAfter string, acked chan<- string) error {
	cfg := plan.GetSecagg()
	n := int(cfg.GetNumParticipants())
	round, err := secagg.NewRound(privacyconf.SecAgg(cfg), plan.TaskId, plan.Round, n)
	if err != nil {
		return err
	}
	peers := map[uint32]ed25519.PublicKey{}
	client, err := secagg.NewClient(round, secagg.ClientOptions{ParticipantID: plan.ParticipantId, Rand: crand.Reader,
		Identity: d.key, KeyID: d.id, VerifyPeer: func(p uint32, _ string, msg, sig []byte) error {
			if k, ok := peers[p]; ok && ed25519.Verify(k, msg, sig) {
				return nil
			}
			return fmt.Errorf("participant %d: bad signature", p)
		}})
	if err != nil {
		return err
	}
	down := make(chan *nats.Msg, 8)
	sub, err := d.h.nc.ChanSubscribe(wire.SecAggDownSubject(plan.TaskId, plan.Round, d.id), down)
	if err != nil {
		return err
	}
	defer sub.Unsubscribe()
	if err := d.h.nc.Flush(); err != nil {
		return err
	}
	send := func(up *pb.SecAggUp) error {
		up.TaskId, up.Round, up.DeviceId = plan.TaskId, plan.Round, d.id
		b, _ := proto.Marshal(up)
		m, err := d.h.nc.Request(wire.SecAggUpSubject(plan.TaskId, plan.Round, d.id), b, time.Minute)
		if err != nil {
			return err
		}
		var ack pb.SecAggAck
		if err := proto.Unmarshal(m.Data, &ack); err != nil {
			return err
		}
		if !ack.Accepted {
			return fmt.Errorf("refused: %s", ack.Reason)
		}
		acked <- fmt.Sprintf("%T", up.Msg)
		return nil
	}
	ak, err := client.Advertise()
	if err != nil {
		return err
	}
	ak.IdentityPublicKey = d.key.Public().(ed25519.PublicKey)
	if silentAfter == "nothing" {
		return nil
	}
	if err := send(&pb.SecAggUp{Msg: &pb.SecAggUp_Advertise{Advertise: ak}}); err != nil {
		return err
	}
	for {
		var m *nats.Msg
		select {
		case m = <-down:
		case <-testwait.After(d.h.t):
			return fmt.Errorf("%s: no message from the server", d.id)
		}
		var msg pb.SecAggDown
		if err := proto.Unmarshal(m.Data, &msg); err != nil {
			return err
		}
		switch x := msg.Msg.(type) {
		case *pb.SecAggDown_PeerKeys:
			for _, p := range x.PeerKeys.GetPeers() {
				peers[p.GetParticipantId()] = ed25519.PublicKey(p.GetIdentityPublicKey())
			}
			sk, err := client.ShareKeys(x.PeerKeys)
			if err != nil {
				return err
			}
			if err := send(&pb.SecAggUp{Msg: &pb.SecAggUp_Shares{Shares: sk}}); err != nil {
				return err
			}
			if silentAfter == "shares" {
				return nil
			}
		case *pb.SecAggDown_ForwardedShares:
			q, err := secagg.NewQuantizer(round.Bits(), cfg.GetClipRange(), n, cfg.GetMaxWeight())
			if err != nil {
				return err
			}
			values, err := q.Quantize(delta, weight, mrand.New(mrand.NewPCG(1, 2)))
			if err != nil {
				return err
			}
			if isDistributedDP(plan) {
				// Zeros of the padded dimension (the model's 8 is a power of
				// two): the distributed-DP tests end before any sum is decoded.
				values = make([]uint32, len(delta))
			}
			mu, err := client.MaskedInput(x.ForwardedShares, values)
			if err != nil {
				return err
			}
			rep := &pb.UpdateReport{TaskId: plan.TaskId, Round: plan.Round, DeviceId: d.id, ModelVersion: plan.GetModel().GetVersion(),
				ModuleSha256: plan.GetModule().GetSha256(), Payload: &pb.UpdateReport_Masked{Masked: mu}, PayloadSha256: wire.MaskedSHA256(mu)}
			if rep.Signature, err = identity.SignReport(d.key, identity.UpdateStatement(rep)); err != nil {
				return err
			}
			d.publish(wire.ReportSubject(plan.TaskId, plan.Round, d.id), rep, wire.MsgID("update", plan.TaskId, plan.Round, d.id))
		case *pb.SecAggDown_Survivors:
			cc, err := client.Consistency(x.Survivors)
			if err != nil {
				return err
			}
			if err := send(&pb.SecAggUp{Msg: &pb.SecAggUp_Consistency{Consistency: cc}}); err != nil {
				return err
			}
		case *pb.SecAggDown_Unmask:
			ur, err := client.Unmask(x.Unmask)
			if err != nil {
				return err
			}
			return send(&pb.SecAggUp{Msg: &pb.SecAggUp_Unmask{Unmask: ur}})
		case *pb.SecAggDown_Abort:
			return fmt.Errorf("aborted: %s", x.Abort.GetReason())
		}
	}
}

func secureTask(h *harness) *pb.Task {
	return h.baseTask(func(t *pb.Task) {
		t.CohortTarget, t.ReportGoal = 6, 3
		t.Secagg = &pb.SecAggConfig{ClipRange: 1, MaxWeight: 10, StageTimeout: durationpb.New(5 * time.Second)}
	})
}

// TestSecureRoundStages drives every stage of a secure round on the fake
// clock: a device that never advertises (the advertisement stage closes
// once quiet, a stage timeout after the others advertised), one that
// vanishes after sharing its keys (the masked input closes once quiet and
// its mask is recovered from its neighbours' shares), and four that see the round through. The committed model moves
// by exactly the survivors' weighted mean, up to quantization.
func TestSecureRoundStages(t *testing.T) {
	h := newHarness(t)
	task := h.start(secureTask(h))
	ev := h.watch(task.Id)
	devs, plans := h.joinCohort(6)
	for _, p := range plans {
		if p.GetSecagg().GetNumParticipants() != 6 {
			t.Fatalf("plan: %v", p.GetSecagg())
		}
	}
	silent := []string{"nothing", "shares", "", "", "", ""}
	deltas := [][]float32{constant(8, 0.9), constant(8, 0.9), constant(8, 0.1), constant(8, 0.2), constant(8, 0.3), constant(8, 0)}
	weights := []float64{1, 1, 1, 2, 3, 4}
	acked := make(chan string, 64)
	results := make([]<-chan error, 6)
	for i, d := range devs {
		results[i] = d.secure(plans[i], deltas[i], weights[i], silent[i], acked)
	}
	// Five advertise; the sixth's silence holds the stage to its timeout.
	stage := 5 * time.Second
	awaitAcks(t, acked, "*fleetlearnv1.SecAggUp_Advertise", 5)
	awaitArmed(t, h.clk, h.clk.Now().Add(stage))
	h.clk.Advance(stage)
	// Shares close early (all five shared); one device then vanishes, so the
	// masked input closes once quiet, a stage timeout after the last input
	// (setting the clock to its latest close, the report deadline minus the
	// two stages after it, passes that).
	awaitAcks(t, acked, "*fleetlearnv1.SecAggUp_Shares", 5)
	for _, d := range devs[2:] {
		if r := d.receipt(); !r.Accepted {
			t.Fatalf("%s: masked input refused: %s", d.id, r.Reason)
		}
	}
	plan := plans[2]
	h.clk.Set(plan.GetReportDeadline().AsTime().Add(-2 * stage))
	for i := 2; i < 6; i++ {
		if err := <-results[i]; err != nil {
			t.Fatalf("device %d: %v", i, err)
		}
	}
	got := h.next(ev)
	if got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED || got.Reported != 4 {
		t.Fatalf("secure round: %v", got)
	}
	// (1·0.1 + 2·0.2 + 3·0.3 + 4·0) / 10
	want := 1 + (0.1+0.4+0.9)/10
	if m := h.current(task.Id).Flatten(); math.Abs(float64(m[0])-want) > 1e-4 {
		t.Fatalf("model[0] = %v, want %v", m[0], want)
	}
}

// TestSecureRoundTooFewAdvertise: selection ends with enough devices, but
// too few advertise keys for the threshold. Once the stage has gone quiet
// (a stage timeout without an answer) closing would lose the round, so it
// waits on; at its cap, a quarter of the time left to the masked input's
// deadline, the round is aborted (every device told so) and abandoned.
func TestSecureRoundTooFewAdvertise(t *testing.T) {
	h := newHarness(t)
	task := h.start(secureTask(h))
	ev := h.watch(task.Id)
	var results []<-chan error
	var plan *pb.RoundPlan
	acked := make(chan string, 64)
	for i := range 6 {
		d := h.enroll(fmt.Sprintf("dev-%d", i), 10)
		plan = d.join()
		silent := "nothing"
		if i < 2 {
			silent = ""
		}
		results = append(results, d.secure(plan, constant(8, 0.1), 1, silent, acked))
	}
	stage := 5 * time.Second
	start := h.clk.Now()
	awaitAcks(t, acked, "*fleetlearnv1.SecAggUp_Advertise", 2)
	awaitArmed(t, h.clk, start.Add(stage))
	h.clk.Advance(stage)
	capAt := start.Add(plan.GetReportDeadline().AsTime().Add(-2*stage).Sub(start) / 4)
	awaitArmed(t, h.clk, capAt)
	select {
	case got := <-ev:
		t.Fatalf("round event before the advertisement stage's cap: %v", got)
	default:
	}
	h.clk.Set(capAt)
	got := h.next(ev)
	if got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_ABANDONED || !containsAll(got.Reason, "secure aggregation") {
		t.Fatalf("round: %v", got)
	}
	for _, r := range results[:2] {
		if err := <-r; err == nil || !containsAll(err.Error(), "aborted") {
			t.Fatalf("advertiser: %v", err)
		}
	}
}

// TestSecureSlowAdvertisersKeepTheRound: two devices advertise at once,
// the other four only after a stage timeout of silence (a large cohort's
// model downloads take that long). A fixed timer closed the stage then and
// lost the round; closing would leave two advertisers, too few for the
// threshold, so the stage waits, and the round commits with all six.
func TestSecureSlowAdvertisersKeepTheRound(t *testing.T) {
	h := newHarness(t)
	task := h.start(secureTask(h))
	ev := h.watch(task.Id)
	devs, plans := h.joinCohort(6)
	stage := 5 * time.Second
	start := h.clk.Now()
	acked := make(chan string, 64)
	results := make([]<-chan error, 6)
	for i := range 2 {
		results[i] = devs[i].secure(plans[i], constant(8, 0.1), 1, "", acked)
	}
	awaitAcks(t, acked, "*fleetlearnv1.SecAggUp_Advertise", 2)
	awaitArmed(t, h.clk, start.Add(stage))
	h.clk.Advance(stage)
	awaitArmed(t, h.clk, start.Add(plans[0].GetReportDeadline().AsTime().Add(-2*stage).Sub(start)/4))
	for i := 2; i < 6; i++ {
		results[i] = devs[i].secure(plans[i], constant(8, 0.1), 1, "", acked)
	}
	for i, r := range results {
		if err := <-r; err != nil {
			t.Fatalf("device %d: %v", i, err)
		}
	}
	if got := h.next(ev); got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED || got.Reported != 6 {
		t.Fatalf("secure round: %v", got)
	}
}

// TestSecureStageQuietExtends: a stage that is still receiving answers is
// not closed a stage timeout after it began. Four devices advertise at
// once, a fifth 4 s later; the sixth never does. The stage goes quiet a
// stage timeout after the fifth answer (the answers took 4 s, and half of
// that is less than the timeout), not after the first four, and closes
// then with five.
func TestSecureStageQuietExtends(t *testing.T) {
	h := newHarness(t)
	task := h.start(secureTask(h))
	ev := h.watch(task.Id)
	devs, plans := h.joinCohort(6)
	stage := 5 * time.Second
	start := h.clk.Now()
	acked := make(chan string, 64)
	results := make([]<-chan error, 6)
	for i := range 4 {
		results[i] = devs[i].secure(plans[i], constant(8, 0.1), 1, "", acked)
	}
	awaitAcks(t, acked, "*fleetlearnv1.SecAggUp_Advertise", 4)
	awaitArmed(t, h.clk, start.Add(stage))
	h.clk.Advance(4 * time.Second)
	results[4] = devs[4].secure(plans[4], constant(8, 0.1), 1, "", acked)
	results[5] = devs[5].secure(plans[5], constant(8, 0.1), 1, "nothing", acked)
	awaitAcks(t, acked, "*fleetlearnv1.SecAggUp_Advertise", 1)
	quiet := start.Add(4*time.Second + stage)
	awaitArmed(t, h.clk, quiet)
	if slices.ContainsFunc(h.clk.Deadlines(), start.Add(stage).Equal) {
		t.Fatal("the stage still closes a stage timeout after it began, with answers coming")
	}
	h.clk.Set(quiet)
	for i, r := range results {
		if err := <-r; err != nil {
			t.Fatalf("device %d: %v", i, err)
		}
	}
	if got := h.next(ev); got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED || got.Reported != 5 {
		t.Fatalf("secure round: %v", got)
	}
}

// awaitAcks waits for n accepted stage messages of type typ.
// awaitArmed waits until a timer is armed to fire at: the coordinator arms
// a stage's timer after it has acknowledged the message that began the
// stage, so advancing the clock on the acknowledgement alone could pass
// before the timer exists, which would then never fire.
func awaitArmed(t *testing.T, clk *clock.Fake, at time.Time) {
	t.Helper()
	guard := testwait.After(t)
	for {
		changed := clk.Changed()
		if slices.ContainsFunc(clk.Deadlines(), at.Equal) {
			return
		}
		select {
		case <-changed:
		case <-guard:
			t.Fatalf("no timer armed for %v; pending: %v", at, clk.Deadlines())
		}
	}
}

func awaitAcks(t *testing.T, acked <-chan string, typ string, n int) {
	t.Helper()
	awaitAllAcks(t, acked, map[string]int{typ: n})
}

// awaitAllAcks waits for the stage messages want counts, by type. A device
// sends its next stage's message as soon as the server answers, so when the
// server may close a stage before the test has seen every ack of it, the
// stages are awaited together: a wait for one type alone would consume, and
// lose, acks of the next.
func awaitAllAcks(t *testing.T, acked <-chan string, want map[string]int) {
	t.Helper()
	left := 0
	for _, n := range want {
		left += n
	}
	for left > 0 {
		select {
		case got := <-acked:
			if want[got] > 0 {
				want[got]--
				left--
			}
		case <-testwait.After(t):
			t.Fatalf("timed out waiting for %v more acks", want)
		}
	}
}
