package coord

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"math"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/aggregator"
	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/clock"
	"github.com/fleetlearn/fleetlearn/privacy/dp"
	"github.com/fleetlearn/fleetlearn/privacy/secagg"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/privacyconf"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/round"
)

// Secure aggregation defaults for SecAggConfig fields left zero.
const (
	DefaultSecAggStageTimeout = privacyconf.DefaultSecAggStageTimeout
	DefaultSecAggMaxWeight    = privacyconf.DefaultSecAggMaxWeight
	DefaultSecAggClipRange    = privacyconf.DefaultSecAggClipRange
	// maxSecAggUpBytes bounds one SecAggUp message: a ShareKeys message holds
	// two 32-byte shares plus AES-GCM overhead per neighbour.
	maxSecAggUpBytes = 4 << 20
)

// SecureConfig returns the secure aggregation parameters of a round with n
// participants: the task's settings with every default filled in, the round's
// graph seed and n. It fails for settings no round could use; the rules are
// privacyconf's, which task creation checks too.
func SecureConfig(task *pb.SecAggConfig, taskID string, round uint64, n int, seed uint64) (*secagg.Round, *pb.SecAggConfig, error) {
	return privacyconf.ResolveSecAgg(task, taskID, round, n, seed, privacyconf.APINames)
}

// secUp is one device's stage message, handed from the NATS subscription to
// the round's goroutine, which owns the secagg.Server.
type secUp struct {
	device string
	msg    *pb.SecAggUp
	reply  func(reason string)
}

// secureRun is the secure aggregation state of an open round. A cohort
// larger than the task's group size runs as groups (privacyconf.GroupSizes),
// each an independent SecAgg+ instance with its own server; they move
// through the stages together and their sums are added.
type secureRun struct {
	// cfg is the round's settings as a one-group plan carries them: the
	// stage timeout, the ring. Each group has its own in groups.
	cfg *pb.SecAggConfig
	// sizes are the groups' sizes, for privacyconf.GroupOf.
	sizes  []int
	groups []*secGroup
	// decode turns the unmasked sum into Σ wₖ·Δₖ and Σ wₖ, given the number
	// of updates in it; with adaptive clipping it also returns the count
	// of unclipped updates the sum carries (noised under distributed DP),
	// otherwise NaN.
	decode func(sum []uint32, count int) (weighted []float64, total, unclipped float64, err error)
	// slack bounds how far decoding can move the mean of count updates of
	// total weight in L2 (+Inf where device noise is part of the sum).
	slack func(count int, total float64) float64
	ups   chan secUp
	// stageStart is when the current stage began, for its duration metric.
	stageStart time.Time
}

// secGroup is one SecAgg+ instance of a round: its participants are
// numbered 1..n within it.
type secGroup struct {
	number uint32 // 1-based; 0 when the round is one group
	round  *secagg.Round
	srv    *secagg.Server
	cfg    *pb.SecAggConfig // what the group's plans carry
	// keys are the identity keys devices advertised, by participant: the
	// server checks signatures with them before relaying (clients check
	// again).
	keys     map[uint32]ed25519.PublicKey
	devices  map[uint32]string // participant → device
	expected map[uint32]bool   // who the current stage waits for
	got      map[uint32]bool   // who sent this stage's message
	// failed says why the group's aggregation stopped; "" while it runs.
	// The round goes on without it while the other groups carry enough.
	failed string
}

func (g *secGroup) verify(participant uint32, _ string, msg, sig []byte) error {
	k, ok := g.keys[participant]
	if !ok || !ed25519.Verify(k, msg, sig) {
		return fmt.Errorf("participant %d: signature does not verify", participant)
	}
	return nil
}

// group returns the group of a round participant (its store number) and
// the participant's number within the group.
func (s *secureRun) group(p uint32) (*secGroup, uint32, bool) {
	g, local, ok := privacyconf.GroupOf(s.sizes, p)
	if !ok {
		return nil, 0, false
	}
	if g == 0 {
		return s.groups[0], local, true
	}
	return s.groups[g-1], local, true
}

// live returns the groups whose aggregation goes on.
func (s *secureRun) live() []*secGroup {
	out := make([]*secGroup, 0, len(s.groups))
	for _, g := range s.groups {
		if g.failed == "" {
			out = append(out, g)
		}
	}
	return out
}

// stage is the stage the live groups are in (they close stages together).
func (s *secureRun) stage() secagg.Stage {
	for _, g := range s.groups {
		if g.failed == "" {
			return g.srv.Stage()
		}
	}
	return secagg.StageDone
}

// counts are the answers the current stage has and waits for, over the
// live groups.
func (s *secureRun) counts() (got, expected int) {
	for _, g := range s.live() {
		got += len(g.got)
		expected += len(g.expected)
	}
	return got, expected
}

// minCohort is the fewest seated devices selection may end with: enough
// for the smallest group's threshold.
func (s *secureRun) minCohort() int {
	m := 0
	for i, g := range s.groups {
		if t := g.round.Threshold() + 1; i == 0 || t < m {
			m = t
		}
	}
	return m
}

// planFor is the plan of the round's participant p: in a round of groups,
// with its group's settings and its number within the group.
func (r *roundRun) planFor(p uint32) *pb.RoundPlan {
	out := withParticipant(r.plan, p)
	if r.secure != nil && len(r.secure.groups) > 1 {
		if g, local, ok := r.secure.group(p); ok {
			out.Secagg, out.ParticipantId = g.cfg, local
		}
	}
	return out
}

// handleSecAggUp routes a device's stage message to its task's open round.
func (c *Coordinator) handleSecAggUp(m *nats.Msg) {
	reply := func(reason string) {
		b, _ := proto.Marshal(&pb.SecAggAck{Accepted: reason == "", Reason: reason})
		m.Respond(b)
	}
	task, round, device, err := wire.ParseSecAggUpSubject(m.Subject)
	if err != nil {
		reply(err.Error())
		return
	}
	if len(m.Data) > maxSecAggUpBytes {
		reply(fmt.Sprintf("message of %d bytes exceeds %d", len(m.Data), maxSecAggUpBytes))
		return
	}
	var up pb.SecAggUp
	if err := proto.Unmarshal(m.Data, &up); err != nil {
		reply("malformed message: " + err.Error())
		return
	}
	if up.TaskId != task || up.Round != round || up.DeviceId != device {
		reply(fmt.Sprintf("message names %s/%d/%s, subject %s/%d/%s", up.TaskId, up.Round, up.DeviceId, task, round, device))
		return
	}
	var sec *secureRun
	if _, r := c.openRound(task, round); r != nil {
		sec = r.secure
	}
	if sec == nil {
		reply(fmt.Sprintf("round %d of task %q is not an open secure round", round, task))
		return
	}
	select {
	case sec.ups <- secUp{device: device, msg: &up, reply: reply}:
	default:
		reply("server busy; the stage will close without this message")
	}
}

// runSecure runs the stages of a secure aggregation round after its setup
// (runRound): selection and key advertisement, share keys, masked input,
// consistency, unmasking. Each stage closes by the round engine's rule (round.StageTiming).
// It returns nil once the round is closed in the store.
func (t *taskRun) runSecure(ctx context.Context, r *roundRun, col aggregator.Collector, msgs <-chan jetstream.Msg) error {
	sec := r.secure
	stageTimeout := sec.cfg.GetStageTimeout().AsDuration()
	now := t.c.now()
	selTimer := t.clock().NewTimer(max(0, r.selEnd.Sub(now)))
	defer selTimer.Stop()
	// The stage timer, at most one, fires when the current stage's close is
	// to be decided again; nil while none is armed.
	var (
		stageTimer clock.Timer
		stageC     <-chan time.Time
		stageAt    time.Time
	)
	disarm := func() {
		if stageTimer != nil {
			stageTimer.Stop()
			stageTimer, stageC, stageAt = nil, nil, time.Time{}
		}
	}
	defer disarm()
	arm := func(at time.Time) {
		if stageTimer != nil && at.Equal(stageAt) {
			return
		}
		disarm()
		stageTimer = t.clock().NewTimer(max(0, at.Sub(t.c.now())))
		stageC, stageAt = stageTimer.C(), at
	}
	abortAs := func(reason string, short bool) error {
		for _, g := range sec.groups {
			t.abortGroup(r, g, reason)
		}
		return t.abandonAs(ctx, r, reason, short)
	}
	abort := func(reason string) error { return abortAs(reason, false) }
	// The stages are the aggregation: its span holds an event per stage.
	t.aggregation(r)

	// The current stage's progress: when it began waiting (not while
	// selection is open), the answers counted and when the latest came.
	stages := round.Stages{MinQuiet: stageTimeout, Deadline: r.row.Deadline}
	for {
		// An answer counts from when it was taken, before the device is
		// answered: a device (or a test driving the clock) that has its
		// reply must find the stage's next wake already decided from the
		// time it answered, not from a clock that moved meanwhile.
		var now time.Time
		select {
		case <-ctx.Done():
			// Shares and masks live in memory only: a resumed round is abandoned.
			return ctx.Err()
		case up := <-sec.ups:
			now = t.c.now()
			up.reply(t.secureUp(r, up))
		case m := <-msgs:
			now = t.c.now()
			t.handleMasked(r, m)
		case <-r.kick:
			now = t.c.now()
		case <-selTimer.C():
			now = t.c.now()
			if why := t.endSelection(r, sec.minCohort()); why != "" {
				return abortAs(why, true)
			}
		case <-stageC:
			now = t.c.now()
			stageTimer, stageC, stageAt = nil, nil, time.Time{}
			// Answers that queued up while the server was busy arrived
			// before the timer: they are progress, not late.
			t.drainSecure(r, msgs)
		}
		if r.lost != "" {
			return abort(r.lost)
		}
		// Decide the stage's close; a closed stage's successor is decided
		// at once, so that its timer runs even if no device ever answers.
		for {
			stage := sec.stage()
			if stage == secagg.StageAdvertise {
				if !t.seatAdvertisers(r) {
					break // selection is open
				}
				if !stages.Begun() {
					if why := t.endSelection(r, sec.minCohort()); why != "" {
						return abortAs(why, true)
					}
					stages.Begin(now)
				}
			}
			got, expected := sec.counts()
			d := stages.Decide(now, stage, got, expected, func() bool { return t.stageViable(sec) })
			if !d.Close {
				arm(d.Wake)
				break
			}
			disarm()
			if d.WaitedOut {
				// The round waited out its timer for devices that stayed silent.
				t.mu.Lock()
				r.waitedOut = true
				t.mu.Unlock()
			}
			if err := t.closeStage(r, stage); err != nil {
				return abort(err.Error())
			}
			if sec.stage() == secagg.StageDone {
				return t.finishSecure(ctx, r, col)
			}
			// The next stage begins once its devices have their replies.
			now = t.c.now()
			stages.Begin(now)
		}
	}
}

// seatAdvertisers makes every seated participant one the advertisement
// stage expects, and reports whether selection is over.
func (t *taskRun) seatAdvertisers(r *roundRun) bool {
	sec := r.secure
	t.mu.Lock()
	defer t.mu.Unlock()
	// A check-in reserves its seat (participant 0) before the store gives
	// it a participant: a reservation is neither expected to advertise nor
	// a seat that ends selection, else the stage would wait for a
	// participant 0 that never comes.
	for _, seat := range r.cohort.Seats() {
		if g, local, ok := sec.group(seat.Participant); ok {
			g.expected[local] = true
		}
	}
	if r.cohort.Seated() >= r.cohort.Wanted() {
		r.cohort.EndSelection()
	}
	return !r.cohort.Selecting()
}

// stageViable reports whether closing the current stage now keeps the
// round alive: the close passes every group's SecAgg checks, and the stages
// up to the masked input keep at least as many devices as the round must
// unmask (secureFloor).
func (t *taskRun) stageViable(sec *secureRun) bool {
	kept := 0
	for _, g := range sec.live() {
		k, err := g.srv.Closable()
		if err != nil {
			return false
		}
		kept += k
	}
	switch sec.stage() {
	case secagg.StageAdvertise, secagg.StageShareKeys, secagg.StageMaskedInput:
		floor, _ := t.secureFloor()
		return kept >= floor
	}
	return true
}

// drainSecure handles the stage messages and masked reports queued when it
// is called, and no more: a device flooding the queue cannot keep it going.
func (t *taskRun) drainSecure(r *roundRun, msgs <-chan jetstream.Msg) {
	sec := r.secure
	for n := len(sec.ups) + len(msgs); n > 0; n-- {
		select {
		case up := <-sec.ups:
			up.reply(t.secureUp(r, up))
		case m := <-msgs:
			t.handleMasked(r, m)
		default:
			return
		}
	}
}

func allParticipants(g *secGroup) []uint32 {
	out := make([]uint32, 0, len(g.devices))
	for p := range g.devices {
		out = append(out, p)
	}
	return out
}

// abortGroup tells a group's devices that its aggregation ended.
func (t *taskRun) abortGroup(r *roundRun, g *secGroup, reason string) {
	t.secureDown(g, func(uint32) (*pb.SecAggDown, error) {
		return &pb.SecAggDown{Msg: &pb.SecAggDown_Abort{Abort: &pb.SecAggAbort{Reason: reason}}}, nil
	}, r, allParticipants(g))
}

// closeStage closes the current stage of every live group and sends each
// survivor its reply; the next stage then waits for exactly those devices.
// A group whose close fails stops (its devices are told), and the round goes
// on with the others; it fails when none is left, or when the masked input
// of the groups left is less than the round must unmask.
func (t *taskRun) closeStage(r *roundRun, stage secagg.Stage) error {
	sec := r.secure
	var first error
	for _, g := range sec.live() {
		if err := g.srv.CloseStage(); err != nil {
			err = fmt.Errorf("secure aggregation, %v stage: %w", stage, err)
			if first == nil {
				first = err
			}
			if len(sec.groups) > 1 {
				g.failed = err.Error()
				t.log().Info("secure aggregation group stopped", "round", r.row.Round, "group", g.number, "err", err)
				t.abortGroup(r, g, fmt.Sprintf("group %d: %v", g.number, err))
			}
		}
	}
	live := sec.live()
	if len(live) == 0 || len(sec.groups) == 1 && first != nil {
		return first
	}
	t.observeStage(sec, stage)
	if stage == secagg.StageMaskedInput {
		// Before anyone is asked for a share: a sum of fewer masked updates
		// than the round needs is never unmasked, so no device's shares
		// help reveal a sum of a few inputs.
		survivors := 0
		for _, g := range live {
			ids, err := g.srv.Survivors()
			if err != nil {
				return fmt.Errorf("secure aggregation, %v stage: %w", stage, err)
			}
			survivors += len(ids)
		}
		if floor, what := t.secureFloor(); survivors < floor {
			return fmt.Errorf("secure aggregation: %d masked updates arrived, fewer than %s %d; the round is abandoned before unmasking and the next round retries",
				survivors, what, floor)
		}
	}
	answered, sent := 0, 0
	for _, g := range live {
		next := map[uint32]bool{}
		var reply func(id uint32) (*pb.SecAggDown, error)
		switch stage {
		case secagg.StageAdvertise:
			reply = func(id uint32) (*pb.SecAggDown, error) {
				pk, err := g.srv.PeerKeys(id)
				return &pb.SecAggDown{Msg: &pb.SecAggDown_PeerKeys{PeerKeys: pk}}, err
			}
		case secagg.StageShareKeys:
			reply = func(id uint32) (*pb.SecAggDown, error) {
				fs, err := g.srv.ForwardedShares(id)
				return &pb.SecAggDown{Msg: &pb.SecAggDown_ForwardedShares{ForwardedShares: fs}}, err
			}
		case secagg.StageMaskedInput:
			reply = func(id uint32) (*pb.SecAggDown, error) {
				ss, err := g.srv.SurvivorSet(id)
				return &pb.SecAggDown{Msg: &pb.SecAggDown_Survivors{Survivors: ss}}, err
			}
		case secagg.StageConsistency:
			reply = func(id uint32) (*pb.SecAggDown, error) {
				ur, err := g.srv.UnmaskRequest(id)
				return &pb.SecAggDown{Msg: &pb.SecAggDown_Unmask{Unmask: ur}}, err
			}
		}
		if reply != nil {
			for _, id := range t.secureDown(g, reply, r, allParticipants(g)) {
				next[id] = true
			}
		}
		answered += len(g.got)
		sent += len(next)
		g.expected, g.got = next, map[uint32]bool{}
	}
	t.log().Debug("secure aggregation stage closed", "round", r.row.Round, "stage", stage, "groups", len(live),
		"answered", answered, "next", sent)
	t.stageClosed(r, stage.String(), answered, sent)
	return nil
}

// secureDown sends reply(id) to every participant of the group that has one
// (the server refuses replies to those it dropped) and returns who was sent
// one.
func (t *taskRun) secureDown(g *secGroup, reply func(uint32) (*pb.SecAggDown, error), r *roundRun, ids []uint32) []uint32 {
	var sent []uint32
	for _, id := range ids {
		down, err := reply(id)
		if err != nil {
			continue // dropped at this stage
		}
		down.TaskId, down.Round = t.id, r.row.Round
		b, err := proto.Marshal(down)
		if err != nil {
			t.log().Error("marshal secagg reply", "err", err)
			continue
		}
		if err := t.c.d.NC.Publish(wire.SecAggDownSubject(t.id, r.row.Round, g.devices[id]), b); err != nil {
			t.log().Warn("secagg reply not sent", "device", g.devices[id], "err", err)
			continue
		}
		sent = append(sent, id)
	}
	return sent
}

// secureUp records one device's stage message; it returns the refusal
// reason, or "" when the message counts.
func (t *taskRun) secureUp(r *roundRun, up secUp) string {
	sec := r.secure
	t.mu.Lock()
	seat, ok := r.cohort.SeatOf(up.device)
	t.mu.Unlock()
	if !ok || seat.Participant == 0 {
		return fmt.Sprintf("device %q is not in the cohort of round %d", up.device, r.row.Round)
	}
	g, id, ok := sec.group(seat.Participant)
	if !ok {
		return fmt.Sprintf("participant %d is in no secure aggregation group of round %d", seat.Participant, r.row.Round)
	}
	if g.failed != "" {
		return fmt.Sprintf("secure aggregation group %d of round %d stopped: %s", g.number, r.row.Round, g.failed)
	}
	var err error
	switch m := up.msg.Msg.(type) {
	case *pb.SecAggUp_Advertise:
		ak := m.Advertise
		if ak.GetParticipantId() != id {
			return fmt.Sprintf("advertisement for participant %d from participant %d", ak.GetParticipantId(), id)
		}
		if len(ak.GetIdentityPublicKey()) != ed25519.PublicKeySize {
			return fmt.Sprintf("identity public key of %d bytes, want %d", len(ak.GetIdentityPublicKey()), ed25519.PublicKeySize)
		}
		t.mu.Lock()
		enrolled := r.keys[up.device]
		t.mu.Unlock()
		if enrolled != nil && !enrolled.Equal(ed25519.PublicKey(ak.GetIdentityPublicKey())) {
			return fmt.Sprintf("advertised identity key is not the key device %q enrolled", up.device)
		}
		_, had := g.keys[id]
		if !had {
			g.keys[id] = ed25519.PublicKey(ak.GetIdentityPublicKey())
		}
		if err = g.srv.AddAdvertise(ak); err != nil && !had {
			delete(g.keys, id) // a refused first advertisement leaves no key behind
		}
		if err == nil {
			g.devices[id] = up.device
		}
	case *pb.SecAggUp_Shares:
		err = checkSender(m.Shares.GetParticipantId(), id)
		if err == nil {
			err = g.srv.AddShares(m.Shares)
		}
	case *pb.SecAggUp_Consistency:
		err = checkSender(m.Consistency.GetParticipantId(), id)
		if err == nil {
			err = g.srv.AddConsistency(m.Consistency)
		}
	case *pb.SecAggUp_Unmask:
		err = checkSender(m.Unmask.GetParticipantId(), id)
		if err == nil {
			err = g.srv.AddUnmask(m.Unmask)
		}
	default:
		return "message has no stage payload"
	}
	if err != nil {
		t.log().Info("secagg message refused", "round", r.row.Round, "device", up.device, "err", err)
		return err.Error()
	}
	g.got[id] = true
	return ""
}

func checkSender(claimed, actual uint32) error {
	if claimed != actual {
		return fmt.Errorf("message for participant %d from participant %d", claimed, actual)
	}
	return nil
}

// handleMasked takes a masked update report into the secure sum, or refuses
// it with a receipt.
func (t *taskRun) handleMasked(r *roundRun, m jetstream.Msg) {
	t.settle(r, m, "update", func() (string, error) { return t.acceptMasked(r, m) })
}

// acceptMasked checks a masked update report and folds it into the secure
// sum, reading it twice as acceptUpdate does a plaintext one (intake.go):
// the values are checked and hashed as they arrive, and added only once the
// whole report has passed.
func (t *taskRun) acceptMasked(r *roundRun, m jetstream.Msg) (_ string, err error) {
	defer classify(&err, refusedSecAgg)
	sec := r.secure
	device, seat, key, err := t.sender(r, m.Subject(), round.Train)
	if err != nil {
		return device, err
	}
	if wire.IsEvalSubject(m.Subject()) {
		return device, refuse("evaluation report in a round that wants masked updates")
	}
	g, local, ok := sec.group(seat.Participant)
	if !ok {
		return device, refuse("participant %d is in no secure aggregation group", seat.Participant)
	}
	if g.failed != "" {
		return device, refuse("secure aggregation group %d stopped: %s", g.number, g.failed)
	}
	// The device's masked update names its participant number within its group.
	seat.Participant = local
	if err := round.CheckMaskedStage(g.srv.Stage()); err != nil {
		return device, fromRound(err)
	}
	t.startReading(device) // as acceptUpdate
	defer t.stopReading(device)
	next, err := t.reportPieces(r, device, m, false)
	if err != nil {
		return device, err
	}
	bits, dim := g.round.Bits(), g.srv.Dim()
	first := &maskedPass{bits: bits, dim: dim, emit: func([]uint32) error { return nil }}
	rep, err := first.run(next, reportOverhead)
	if err != nil {
		return device, err
	}
	t.c.chargeChunkedBytes(m, first.n)
	if err := t.checkHeader(r, device, rep.TaskId, rep.Round, rep.DeviceId, rep.ModelVersion, rep.ModuleSha256); err != nil {
		return device, err
	}
	mu := rep.GetMasked()
	if err := round.CheckMasked(round.Masked{Present: mu != nil, Examples: rep.NumExamples, Metrics: len(rep.GetMetrics().GetValues()),
		Participant: mu.GetParticipantId(), Bits: int(mu.GetBits())}, seat, bits); err != nil {
		return device, fromRound(err)
	}
	if first.bad != nil {
		return device, refuse("%v", first.bad)
	}
	// The signed hash is over the values as uint32s, whichever form carried them.
	if got := first.sha(); got != rep.PayloadSha256 {
		return device, refuse("payload sha256 %s does not match the declared %q", got, rep.PayloadSha256)
	}
	if err := t.checkSignature(key, rep.Signature, rep.KeyId, identity.UpdateStatement(rep)); err != nil {
		return device, err
	}
	part, err := g.srv.BeginMasked(mu.ParticipantId, mu.Bits)
	if err != nil {
		return device, refuse("%v", err)
	}
	if next, err = t.reportPieces(r, device, m, true); err == nil {
		second := &maskedPass{bits: bits, dim: dim, emit: part.Write, again: true}
		if _, err = second.run(next, reportOverhead); err == nil && second.bad != nil {
			err = second.bad
		}
		if err == nil {
			err = part.Close()
		}
	}
	if err != nil {
		r.lost = fmt.Sprintf("the secure sum holds part of the masked update of %s, whose report could not be read again: %v", device, err)
		return device, fmt.Errorf("report of %s could not be read again: %w", device, err)
	}
	g.got[local] = true
	return device, nil
}

// maskedPass is one reading of a masked update report: its values go to
// emit and their uint32 form is hashed.
type maskedPass struct {
	bits, dim int
	emit      func([]uint32) error
	dec       *secagg.MaskedDecoder
	h         hash.Hash
	scratch   []byte
	n         int
	bad       error // the values' decoding error, reported after the header checks
	again     bool  // a second read: not hashed again (reportPieces)
}

func (p *maskedPass) open(f wire.PayloadField, size uint64) (func([]byte) error, error) {
	if f != wire.MaskedValues && f != wire.MaskedPacked {
		return nil, refuse("a secure round takes masked updates only")
	}
	p.h = sha256.New()
	dec, err := secagg.NewMaskedDecoder(p.bits, p.dim, f == wire.MaskedPacked, size, func(v []uint32) error {
		if !p.again {
			p.scratch = p.scratch[:0]
			for _, x := range v {
				p.scratch = binary.LittleEndian.AppendUint32(p.scratch, x)
			}
			p.h.Write(p.scratch)
		}
		return p.emit(v)
	})
	if err != nil {
		p.bad = err
		return func([]byte) error { return nil }, nil
	}
	p.dec = dec
	return func(b []byte) error {
		if p.bad != nil {
			return nil
		}
		if err := p.dec.Write(b); err != nil {
			p.bad = err
		}
		return nil
	}, nil
}

// run scans the report from next; the report comes back without its values.
func (p *maskedPass) run(next func() ([]byte, error), limit int) (*pb.UpdateReport, error) {
	rep, f, err := scanReport(next, limit, p.open, &p.n)
	if err != nil {
		return nil, err
	}
	if f == wire.NoPayload {
		return nil, refuse("a secure round takes masked updates only")
	}
	if p.bad == nil && p.dec != nil {
		p.bad = p.dec.Close()
	}
	return rep, nil
}

func (p *maskedPass) sha() string { return hex.EncodeToString(p.h.Sum(nil)) }

// finishSecure unmasks each group's sum, adds them, decodes the round's
// sum and commits the round. A group whose sum cannot be unmasked is left
// out while the others carry enough updates.
func (t *taskRun) finishSecure(ctx context.Context, r *roundRun, col aggregator.Collector) error {
	sec := r.secure
	var sum []uint32
	var devices []string
	for _, g := range sec.live() {
		part, err := g.srv.Result()
		var survivors []uint32
		if err == nil {
			survivors, err = g.srv.Survivors()
		}
		if err != nil {
			if len(sec.groups) == 1 {
				return t.abandon(ctx, r, fmt.Sprintf("secure aggregation: %v", err))
			}
			g.failed = err.Error()
			t.log().Info("secure aggregation group stopped", "round", r.row.Round, "group", g.number, "err", err)
			continue
		}
		if sum == nil {
			sum = part
		} else {
			// Each group's sum is in [0, 2^bits); so is the round's.
			mask := uint32(1<<g.round.Bits() - 1)
			for i, v := range part {
				sum[i] = (sum[i] + v) & mask
			}
		}
		for _, id := range survivors {
			devices = append(devices, g.devices[id])
		}
	}
	if floor, what := t.secureFloor(); len(devices) < floor {
		return t.abandon(ctx, r, fmt.Sprintf("secure aggregation: %d updates unmasked, fewer than %s %d", len(devices), what, floor))
	}
	if t.dp != nil && t.dp.dist != nil && len(devices) < int(t.dp.cfg.GetMinNoiseContributors()) {
		// Fewer devices than the noise was split across: too little noise.
		return t.abandon(ctx, r, fmt.Sprintf("distributed DP: %d updates in the sum, fewer than the %d noise contributors",
			len(devices), t.dp.cfg.GetMinNoiseContributors()))
	}
	weighted, total, unclipped, err := sec.decode(sum, len(devices))
	if err != nil {
		return t.abandon(ctx, r, fmt.Sprintf("secure aggregation: %v", err))
	}
	if !math.IsNaN(unclipped) {
		r.noteClipCount(unclipped)
	}
	if err := col.AddSum(weighted, total, len(devices)); err != nil {
		return t.abandon(ctx, r, fmt.Sprintf("secure aggregation: %v", err))
	}
	t.mu.Lock()
	for _, d := range devices {
		r.cohort.Report(d)
	}
	t.mu.Unlock()
	reason := fmt.Sprintf("secure sum of %d masked updates", len(devices))
	if len(sec.groups) > 1 {
		reason += fmt.Sprintf(" from %d of %d groups", len(sec.live()), len(sec.groups))
	}
	return t.commit(ctx, r, col, newMetricMean(), reason, sec.slack(len(devices), total))
}

// secureFloor is the fewest masked updates a secure round unmasks: the
// report goal, or distributed DP's noise contributors when there are more
// of them.
func (t *taskRun) secureFloor() (int, string) {
	floor, what := int(t.spec.GetReportGoal()), "the report goal"
	if t.dp != nil && t.dp.dist != nil {
		if n := int(t.dp.cfg.GetMinNoiseContributors()); n > floor {
			floor, what = n, "the distributed DP noise contributors"
		}
	}
	return floor, what
}

// errSecureResume explains why a secure round found open after a restart is abandoned.
var errSecureResume = errors.New("secure aggregation state (shares, masks) is held in memory only and was lost in a restart")

// newSecureRun prepares the server side of a secure round of n participants
// and dim model parameters: one SecAgg+ server per group.
func (t *taskRun) newSecureRun(roundNum, seed uint64, n, dim int) (*secureRun, error) {
	rounds, cfgs, err := t.secureGroups(roundNum, n, seed)
	if err != nil {
		return nil, err
	}
	sec := &secureRun{cfg: cfgs[0], ups: make(chan secUp, 4*n+16), stageStart: t.c.now()}
	inputDim := dim + 1 // the update and its weight
	if t.dp != nil && t.dp.dist != nil {
		// Distributed DP: devices send their encoded, noised updates; every
		// update has weight 1. The mechanism is derived as the devices
		// derive it, from the round's settings (its bound may be adaptive
		// clipping's).
		dc, _ := privacyconf.Distributed(t.dp.roundConfig())
		dist, err := dp.DistributedFor(dc, dim, rounds[0].Bits())
		if err != nil {
			return nil, err
		}
		if !dist.CountFits(n) {
			return nil, fmt.Errorf("distributed DP: the clipping bits of %d participants do not fit in the %d-bit ring", n, rounds[0].Bits())
		}
		inputDim = dist.EncodedDim()
		dec := dist.NewDecoder(wire.RotationSeed(t.id, roundNum, seed))
		sec.decode = func(sum []uint32, count int) ([]float64, float64, float64, error) {
			if !dist.Counts() {
				v, err := dec.Decode(sum)
				return v, float64(count), math.NaN(), err
			}
			v, unclipped, err := dec.DecodeCounted(sum, count)
			return v, float64(count), unclipped, err
		}
		sec.slack = func(int, float64) float64 { return math.Inf(1) }
	} else {
		// The whole cohort sizes the quantizer: the groups' sums add up to
		// the round's.
		quant, err := secagg.NewQuantizer(rounds[0].Bits(), sec.cfg.GetClipRange(), n, sec.cfg.GetMaxWeight())
		if err != nil {
			return nil, err
		}
		counts := t.adaptive()
		if counts {
			inputDim++ // adaptive clipping's bit follows the weight
		}
		sec.decode = func(sum []uint32, _ int) ([]float64, float64, float64, error) {
			if !counts {
				v, total, err := quant.Dequantize(sum)
				return v, total, math.NaN(), err
			}
			if len(sum) < 3 {
				return nil, 0, 0, fmt.Errorf("a sum of %d values", len(sum))
			}
			unclipped, err := quant.DequantizeCount(sum[len(sum)-1])
			if err != nil {
				return nil, 0, 0, err
			}
			v, total, err := quant.Dequantize(sum[:len(sum)-1])
			// Rounding moves a count of bits by under one.
			return v, total, math.Round(unclipped), err
		}
		// Each update's weighted elements decode within ±Step.
		sec.slack = func(count int, total float64) float64 {
			return math.Sqrt(float64(dim)) * float64(count) * quant.Step() / total
		}
	}
	for i, r := range rounds {
		g := &secGroup{number: cfgs[i].GetGroup(), round: r, cfg: cfgs[i], keys: map[uint32]ed25519.PublicKey{},
			devices: map[uint32]string{}, expected: map[uint32]bool{}, got: map[uint32]bool{}}
		if g.srv, err = secagg.NewServer(r, inputDim, secagg.ServerOptions{VerifyPeer: g.verify, Workers: 2}); err != nil {
			return nil, err
		}
		sec.groups = append(sec.groups, g)
		sec.sizes = append(sec.sizes, r.N())
	}
	return sec, nil
}

// secureGroups is SecureConfig for this task's rounds
// (privacyconf.RoundSecAgg: with DP every update has weight 1, so the
// weight bound is 1 too), split into groups (privacyconf.GroupSizes; one
// under distributed DP, whose noise is calibrated to the whole sum).
func (t *taskRun) secureGroups(roundNum uint64, n int, seed uint64) ([]*secagg.Round, []*pb.SecAggConfig, error) {
	return privacyconf.ResolveSecAggGroups(privacyconf.RoundSecAgg(t.spec), t.id, roundNum, n, seed,
		t.dp != nil && t.dp.dist != nil, privacyconf.APINames)
}

// secureGroupCount is how many groups a secure round of n participants runs
// as, for its memory budget.
func (t *taskRun) secureGroupCount(n int) int {
	return len(privacyconf.GroupSizes(n, privacyconf.RoundSecAgg(t.spec).GetGroupSize(), t.dp != nil && t.dp.dist != nil))
}

// secureStageTimeout is the task's SecAgg stage timeout with its default.
func secureStageTimeout(cfg *pb.SecAggConfig) time.Duration {
	if d := cfg.GetStageTimeout().AsDuration(); d > 0 {
		return d
	}
	return DefaultSecAggStageTimeout
}
