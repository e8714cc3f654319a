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

// secureRun is the secure aggregation state of an open round.
type secureRun struct {
	round *secagg.Round
	srv   *secagg.Server
	cfg   *pb.SecAggConfig
	// decode turns the unmasked sum into Σ wₖ·Δₖ and Σ wₖ, given the number
	// of updates in it.
	decode func(sum []uint32, count int) ([]float64, float64, error)
	// slack bounds how far decoding can move the mean of count updates of
	// total weight in L2 (+Inf where device noise is part of the sum).
	slack func(count int, total float64) float64
	ups   chan secUp
	// keys are the identity keys devices advertised, by participant: the
	// server checks signatures with them before relaying (clients check
	// again).
	keys     map[uint32]ed25519.PublicKey
	devices  map[uint32]string // participant → device
	expected map[uint32]bool   // who the current stage waits for
	got      map[uint32]bool   // who sent this stage's message
	// stageStart is when the current stage began, for its duration metric.
	stageStart time.Time
}

func (s *secureRun) verify(participant uint32, _ string, msg, sig []byte) error {
	k, ok := s.keys[participant]
	if !ok || !ed25519.Verify(k, msg, sig) {
		return fmt.Errorf("participant %d: signature does not verify", participant)
	}
	return nil
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
		t.secureDown(sec, func(uint32) (*pb.SecAggDown, error) {
			return &pb.SecAggDown{Msg: &pb.SecAggDown_Abort{Abort: &pb.SecAggAbort{Reason: reason}}}, nil
		}, r, allParticipants(sec))
		return t.abandonAs(ctx, r, reason, short)
	}
	abort := func(reason string) error { return abortAs(reason, false) }
	// The stages are the aggregation: its span holds an event per stage.
	t.aggregation(r)

	// The current stage's progress: when it began waiting (not while
	// selection is open), the answers counted and when the latest came.
	stages := round.Stages{MinQuiet: stageTimeout, Deadline: r.row.Deadline}
	for {
		select {
		case <-ctx.Done():
			// Shares and masks live in memory only: a resumed round is abandoned.
			return ctx.Err()
		case up := <-sec.ups:
			up.reply(t.secureUp(r, up))
		case m := <-msgs:
			t.handleMasked(r, m)
		case <-r.kick:
		case <-selTimer.C():
			if why := t.endSelection(r, sec.round.Threshold()+1); why != "" {
				return abortAs(why, true)
			}
		case <-stageC:
			stageTimer, stageC, stageAt = nil, nil, time.Time{}
			// Answers that queued up while the server was busy arrived
			// before the timer: they are progress, not late.
			t.drainSecure(r, msgs)
		}
		if r.lost != "" {
			return abort(r.lost)
		}
		now := t.c.now()
		// Decide the stage's close; a closed stage's successor is decided
		// at once, so that its timer runs even if no device ever answers.
		for {
			stage := sec.srv.Stage()
			if stage == secagg.StageAdvertise {
				if !t.seatAdvertisers(r) {
					break // selection is open
				}
				if !stages.Begun() {
					if why := t.endSelection(r, sec.round.Threshold()+1); why != "" {
						return abortAs(why, true)
					}
					stages.Begin(now)
				}
			}
			d := stages.Decide(now, stage, len(sec.got), len(sec.expected), func() bool { return t.stageViable(sec) })
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
			if sec.srv.Stage() == secagg.StageDone {
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
		sec.expected[seat.Participant] = true
	}
	if r.cohort.Seated() >= r.cohort.Wanted() {
		r.cohort.EndSelection()
	}
	return !r.cohort.Selecting()
}

// stageViable reports whether closing the current stage now keeps the
// round alive: the close passes every SecAgg check, and the stages up to
// the masked input keep at least as many devices as the round must unmask
// (secureFloor).
func (t *taskRun) stageViable(sec *secureRun) bool {
	kept, err := sec.srv.Closable()
	if err != nil {
		return false
	}
	switch sec.srv.Stage() {
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

func allParticipants(sec *secureRun) []uint32 {
	out := make([]uint32, 0, len(sec.devices))
	for p := range sec.devices {
		out = append(out, p)
	}
	return out
}

// closeStage closes the server's current stage and sends each survivor its
// reply; the next stage then waits for exactly those devices.
func (t *taskRun) closeStage(r *roundRun, stage secagg.Stage) error {
	sec := r.secure
	if err := sec.srv.CloseStage(); err != nil {
		return fmt.Errorf("secure aggregation, %v stage: %w", stage, err)
	}
	t.observeStage(sec, stage)
	if stage == secagg.StageMaskedInput {
		// Before anyone is asked for a share: a sum of fewer masked updates
		// than the round needs is never unmasked, so no device's shares
		// help reveal a sum of a few inputs.
		survivors, err := sec.srv.Survivors()
		if err != nil {
			return fmt.Errorf("secure aggregation, %v stage: %w", stage, err)
		}
		if floor, what := t.secureFloor(); len(survivors) < floor {
			return fmt.Errorf("secure aggregation: %d masked updates arrived, fewer than %s %d; the round is abandoned before unmasking and the next round retries",
				len(survivors), what, floor)
		}
	}
	next := map[uint32]bool{}
	var reply func(id uint32) (*pb.SecAggDown, error)
	switch stage {
	case secagg.StageAdvertise:
		reply = func(id uint32) (*pb.SecAggDown, error) {
			pk, err := sec.srv.PeerKeys(id)
			return &pb.SecAggDown{Msg: &pb.SecAggDown_PeerKeys{PeerKeys: pk}}, err
		}
	case secagg.StageShareKeys:
		reply = func(id uint32) (*pb.SecAggDown, error) {
			fs, err := sec.srv.ForwardedShares(id)
			return &pb.SecAggDown{Msg: &pb.SecAggDown_ForwardedShares{ForwardedShares: fs}}, err
		}
	case secagg.StageMaskedInput:
		reply = func(id uint32) (*pb.SecAggDown, error) {
			ss, err := sec.srv.SurvivorSet(id)
			return &pb.SecAggDown{Msg: &pb.SecAggDown_Survivors{Survivors: ss}}, err
		}
	case secagg.StageConsistency:
		reply = func(id uint32) (*pb.SecAggDown, error) {
			ur, err := sec.srv.UnmaskRequest(id)
			return &pb.SecAggDown{Msg: &pb.SecAggDown_Unmask{Unmask: ur}}, err
		}
	}
	if reply != nil {
		for _, id := range t.secureDown(sec, reply, r, allParticipants(sec)) {
			next[id] = true
		}
	}
	t.log().Debug("secure aggregation stage closed", "round", r.row.Round, "stage", stage,
		"answered", len(sec.got), "expected", len(sec.expected), "next", len(next))
	t.stageClosed(r, stage.String(), len(sec.got), len(next))
	sec.expected, sec.got = next, map[uint32]bool{}
	return nil
}

// secureDown sends reply(id) to every participant that has one (the server
// refuses replies to those it dropped) and returns who was sent one.
func (t *taskRun) secureDown(sec *secureRun, reply func(uint32) (*pb.SecAggDown, error), r *roundRun, ids []uint32) []uint32 {
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
		if err := t.c.d.NC.Publish(wire.SecAggDownSubject(t.id, r.row.Round, sec.devices[id]), b); err != nil {
			t.log().Warn("secagg reply not sent", "device", sec.devices[id], "err", err)
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
	id := seat.Participant
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
		_, had := sec.keys[id]
		if !had {
			sec.keys[id] = ed25519.PublicKey(ak.GetIdentityPublicKey())
		}
		if err = sec.srv.AddAdvertise(ak); err != nil && !had {
			delete(sec.keys, id) // a refused first advertisement leaves no key behind
		}
		if err == nil {
			sec.devices[id] = up.device
		}
	case *pb.SecAggUp_Shares:
		err = checkSender(m.Shares.GetParticipantId(), id)
		if err == nil {
			err = sec.srv.AddShares(m.Shares)
		}
	case *pb.SecAggUp_Consistency:
		err = checkSender(m.Consistency.GetParticipantId(), id)
		if err == nil {
			err = sec.srv.AddConsistency(m.Consistency)
		}
	case *pb.SecAggUp_Unmask:
		err = checkSender(m.Unmask.GetParticipantId(), id)
		if err == nil {
			err = sec.srv.AddUnmask(m.Unmask)
		}
	default:
		return "message has no stage payload"
	}
	if err != nil {
		t.log().Info("secagg message refused", "round", r.row.Round, "device", up.device, "err", err)
		return err.Error()
	}
	sec.got[id] = true
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
	if err := round.CheckMaskedStage(sec.srv.Stage()); err != nil {
		return device, fromRound(err)
	}
	t.startReading(device) // as acceptUpdate
	defer t.stopReading()
	next, err := t.reportPieces(r, device, m, false)
	if err != nil {
		return device, err
	}
	bits, dim := sec.round.Bits(), sec.srv.Dim()
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
	part, err := sec.srv.BeginMasked(mu.ParticipantId, mu.Bits)
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
	sec.got[seat.Participant] = true
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

// finishSecure unmasks the sum, decodes it and commits the round.
func (t *taskRun) finishSecure(ctx context.Context, r *roundRun, col aggregator.Collector) error {
	sec := r.secure
	sum, err := sec.srv.Result()
	if err != nil {
		return t.abandon(ctx, r, fmt.Sprintf("secure aggregation: %v", err))
	}
	survivors, err := sec.srv.Survivors()
	if err != nil {
		return t.abandon(ctx, r, fmt.Sprintf("secure aggregation: %v", err))
	}
	if t.dp != nil && t.dp.dist != nil && len(survivors) < int(t.dp.cfg.GetMinNoiseContributors()) {
		// Fewer devices than the noise was split across: too little noise.
		return t.abandon(ctx, r, fmt.Sprintf("distributed DP: %d updates in the sum, fewer than the %d noise contributors",
			len(survivors), t.dp.cfg.GetMinNoiseContributors()))
	}
	weighted, total, err := sec.decode(sum, len(survivors))
	if err != nil {
		return t.abandon(ctx, r, fmt.Sprintf("secure aggregation: %v", err))
	}
	if err := col.AddSum(weighted, total, len(survivors)); err != nil {
		return t.abandon(ctx, r, fmt.Sprintf("secure aggregation: %v", err))
	}
	t.mu.Lock()
	for _, id := range survivors {
		r.cohort.Report(sec.devices[id])
	}
	t.mu.Unlock()
	return t.commit(ctx, r, col, newMetricMean(), fmt.Sprintf("secure sum of %d masked updates", len(survivors)),
		sec.slack(len(survivors), total))
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
// and dim model parameters.
func (t *taskRun) newSecureRun(roundNum, seed uint64, n, dim int) (*secureRun, error) {
	round, cfg, err := t.secureConfig(roundNum, n, seed)
	if err != nil {
		return nil, err
	}
	sec := &secureRun{round: round, cfg: cfg, ups: make(chan secUp, 4*n+16),
		keys: map[uint32]ed25519.PublicKey{}, devices: map[uint32]string{}, expected: map[uint32]bool{}, got: map[uint32]bool{},
		stageStart: t.c.now()}
	inputDim := dim + 1 // the update and its weight
	if t.dp != nil && t.dp.dist != nil {
		// Distributed DP: devices send their encoded, noised updates; every
		// update has weight 1.
		inputDim = t.dp.dist.PaddedDim()
		dec := t.dp.dist.NewDecoder(wire.RotationSeed(t.id, roundNum, seed))
		sec.decode = func(sum []uint32, count int) ([]float64, float64, error) {
			v, err := dec.Decode(sum)
			return v, float64(count), err
		}
		sec.slack = func(int, float64) float64 { return math.Inf(1) }
	} else {
		quant, err := secagg.NewQuantizer(round.Bits(), cfg.GetClipRange(), n, cfg.GetMaxWeight())
		if err != nil {
			return nil, err
		}
		sec.decode = func(sum []uint32, _ int) ([]float64, float64, error) { return quant.Dequantize(sum) }
		// Each update's weighted elements decode within ±Step.
		sec.slack = func(count int, total float64) float64 {
			return math.Sqrt(float64(dim)) * float64(count) * quant.Step() / total
		}
	}
	if sec.srv, err = secagg.NewServer(round, inputDim, secagg.ServerOptions{VerifyPeer: sec.verify, Workers: 2}); err != nil {
		return nil, err
	}
	return sec, nil
}

// secureConfig is SecureConfig for this task's rounds
// (privacyconf.RoundSecAgg): with DP every update has weight 1, so the
// weight bound is 1 too.
func (t *taskRun) secureConfig(roundNum uint64, n int, seed uint64) (*secagg.Round, *pb.SecAggConfig, error) {
	return SecureConfig(privacyconf.RoundSecAgg(t.spec), t.id, roundNum, n, seed)
}

// secureStageTimeout is the task's SecAgg stage timeout with its default.
func secureStageTimeout(cfg *pb.SecAggConfig) time.Duration {
	if d := cfg.GetStageTimeout().AsDuration(); d > 0 {
		return d
	}
	return DefaultSecAggStageTimeout
}
