package coord

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
	"github.com/fleetlearn/fleetlearn/wasm"
)

// maxCheckInBytes bounds a check-in message; attributes are small.
const maxCheckInBytes = 16 << 10

// deviceWriteInterval limits how often a polling device's last-seen time is written.
const deviceWriteInterval = time.Minute

// Check-ins are answered by a few workers rather than on the NATS delivery
// goroutine, so one slow store write (a cohort assignment) does not hold up
// every other device; a full queue is answered at once with OVERLOADED.
const (
	checkInWorkers = 4
	checkInQueue   = 1024
)

func (c *Coordinator) handleCheckIn(m *nats.Msg) {
	select {
	case c.checkins <- m:
	default:
		c.d.Metrics.CheckIns.WithLabelValues("overloaded").Inc()
		c.respond(m, retry(c.d.PaceWindow+c.jitter(c.d.PaceWindow), pb.RetryReason_RETRY_REASON_OVERLOADED, "server busy"))
	}
}

// serveCheckIns answers queued check-ins until the coordinator stops.
func (c *Coordinator) serveCheckIns() {
	defer c.wg.Done()
	for {
		select {
		case <-c.ctx.Done():
			return
		case m := <-c.checkins:
			resp, h := c.checkIn(m.Subject, m.Data)
			c.respondWith(m, resp, h)
		}
	}
}

func (c *Coordinator) respond(m *nats.Msg, resp *pb.CheckInResponse) { c.respondWith(m, resp, nil) }

// respondWith answers a check-in with headers h: a plan's carry the round's
// trace context (traceparent), for the device's spans to join the round's
// trace.
func (c *Coordinator) respondWith(m *nats.Msg, resp *pb.CheckInResponse, h nats.Header) {
	b, err := proto.Marshal(resp)
	if err != nil {
		c.d.Log.Error("marshal check-in response", "err", err)
		return
	}
	if h != nil && m.Reply != "" {
		err = m.RespondMsg(&nats.Msg{Data: b, Header: h})
	} else {
		err = m.Respond(b)
	}
	if err != nil {
		c.d.Log.Debug("check-in reply", "err", err)
	}
}

// writeSeen records devices' last-seen times off the check-in path: a
// device's latest sighting replaces one not yet written.
func (c *Coordinator) writeSeen() {
	defer c.wg.Done()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-c.seenKick:
		}
		c.mu.Lock()
		batch := c.unseen
		c.unseen = map[string]sighting{}
		c.mu.Unlock()
		for id, s := range batch {
			ctx, cancel := context.WithTimeout(c.ctx, 5*time.Second)
			if err := c.d.Store.SeeDevice(ctx, id, s.attrs, s.at); err != nil {
				c.d.Log.Warn("recording device", "device", id, "err", err)
			}
			cancel()
		}
	}
}

// sighting is a device's check-in waiting to be written.
type sighting struct {
	attrs *pb.DeviceAttributes
	at    time.Time
}

// maxUnseen bounds the sightings waiting to be written; beyond it new ones
// are dropped (and retried at the device's next check-in).
const maxUnseen = 1 << 16

func retry(d time.Duration, reason pb.RetryReason, detail string) *pb.CheckInResponse {
	return &pb.CheckInResponse{Result: &pb.CheckInResponse_RetryAfter{RetryAfter: &pb.RetryAfter{
		Duration: durationpb.New(d), Reason: reason, Detail: detail}}}
}

// checkIn answers a check-in on subject, with the reply's headers. The
// subject names the device: NATS lets a device publish only on its own
// check-in subject, so the body's device_id must agree with it and is never
// trusted on its own.
func (c *Coordinator) checkIn(subject string, b []byte) (*pb.CheckInResponse, nats.Header) {
	pace := c.d.PaceWindow
	device, err := wire.ParseCheckInSubject(subject)
	if err != nil {
		c.d.Metrics.CheckIns.WithLabelValues("invalid").Inc()
		return retry(10*pace, pb.RetryReason_RETRY_REASON_NOT_ELIGIBLE, err.Error()), nil
	}
	if len(b) > maxCheckInBytes {
		c.d.Metrics.CheckIns.WithLabelValues("invalid").Inc()
		return retry(10*pace, pb.RetryReason_RETRY_REASON_NOT_ELIGIBLE, fmt.Sprintf("check-in of %d bytes exceeds %d", len(b), maxCheckInBytes)), nil
	}
	var ci pb.CheckIn
	if err := proto.Unmarshal(b, &ci); err != nil {
		c.d.Metrics.CheckIns.WithLabelValues("invalid").Inc()
		return retry(10*pace, pb.RetryReason_RETRY_REASON_NOT_ELIGIBLE, "malformed check-in: "+err.Error()), nil
	}
	if ci.DeviceId != device {
		c.d.Metrics.CheckIns.WithLabelValues("invalid").Inc()
		return retry(10*pace, pb.RetryReason_RETRY_REASON_NOT_ELIGIBLE,
			fmt.Sprintf("check-in names device %q on the subject of device %q; a device checks in only as itself", ci.DeviceId, device)), nil
	}
	now := c.now()
	c.noteDevice(ci.DeviceId, ci.Attributes, now)

	c.mu.Lock()
	runs := make([]*taskRun, 0, len(c.tasks))
	for id, tr := range c.tasks {
		if len(ci.TaskIds) == 0 || slices.Contains(ci.TaskIds, id) {
			runs = append(runs, tr)
		}
	}
	c.mu.Unlock()
	// Earliest time any of the candidate tasks is expected to want devices again.
	wait, why, detail := 5*pace, pb.RetryReason_RETRY_REASON_NO_TASK, "no running task"
	for _, tr := range runs {
		plan, h, w, reason, d := tr.offer(&ci, now)
		if plan != nil {
			c.d.Metrics.CheckIns.WithLabelValues("selected").Inc()
			return &pb.CheckInResponse{Result: &pb.CheckInResponse_Plan{Plan: plan}}, h
		}
		if why == pb.RetryReason_RETRY_REASON_NO_TASK || w < wait {
			wait, why, detail = w, reason, d
		}
	}
	c.d.Metrics.CheckIns.WithLabelValues("deferred").Inc()
	// Pace steering: spread the next check-ins over a window after the moment
	// a round is expected to want devices, so they do not arrive as one burst.
	return retry(wait+c.jitter(pace), why, detail), nil
}

func (c *Coordinator) noteDevice(id string, attrs *pb.DeviceAttributes, now time.Time) {
	c.mu.Lock()
	last, ok := c.seen[id]
	if ok && now.Sub(last) < deviceWriteInterval {
		c.mu.Unlock()
		return
	}
	if len(c.unseen) >= maxUnseen {
		c.mu.Unlock()
		return
	}
	c.seen[id] = now
	c.unseen[id] = sighting{attrs: attrs, at: now}
	c.mu.Unlock()
	select {
	case c.seenKick <- struct{}{}:
	default:
	}
}

// eligible checks a device against the task's eligibility and ABI.
func (t *taskRun) eligible(a *pb.DeviceAttributes) (string, pb.RetryReason) {
	if abi := t.moduleABI(); !slices.Contains(a.GetSupportedAbiVersions(), abi) {
		return fmt.Sprintf("device does not support module ABI v%d", abi), pb.RetryReason_RETRY_REASON_UNSUPPORTED_ABI
	}
	return t.meets(a), pb.RetryReason_RETRY_REASON_NOT_ELIGIBLE
}

// moduleABI is the ABI the task's module declared when it was registered;
// modules registered before the registry recorded it are v1.
func (t *taskRun) moduleABI() uint32 {
	if v := t.spec.GetModule().GetAbiVersion(); v != 0 {
		return v
	}
	return wasm.MinABIVersion
}

func (t *taskRun) meets(a *pb.DeviceAttributes) string {
	e := t.spec.GetEligibility()
	switch {
	case a.GetExamplesAvailable() < max(e.GetMinExamples(), 1):
		return fmt.Sprintf("needs at least %d examples, device has %d", max(e.GetMinExamples(), 1), a.GetExamplesAvailable())
	case e.GetRequireCharging() && !a.GetCharging():
		return "task requires charging devices"
	case e.GetRequireIdle() && !a.GetIdle():
		return "task requires idle devices"
	case e.GetRequireUnmetered() && !a.GetUnmetered():
		return "task requires unmetered networks"
	case len(e.GetDeviceClasses()) > 0 && !slices.Contains(e.GetDeviceClasses(), a.GetDeviceClass()):
		return fmt.Sprintf("device class %q not in %v", a.GetDeviceClass(), e.GetDeviceClasses())
	}
	return ""
}

// offer assigns the device to the open round if it may join, with the
// headers of the plan's reply, or says how long to wait. A device already in
// the cohort gets its plan again (it may have restarted), unless it has
// reported.
func (t *taskRun) offer(ci *pb.CheckIn, now time.Time) (*pb.RoundPlan, nats.Header, time.Duration, pb.RetryReason, string) {
	pace := t.c.d.PaceWindow
	// The task's settings (spec, dp) are written while the runner loads; an
	// open round, seen under mu, means loading is over and they are fixed.
	t.mu.Lock()
	r := t.round
	t.mu.Unlock()
	if r == nil {
		return nil, nil, pace, pb.RetryReason_RETRY_REASON_ROUND_FULL, "between rounds"
	}
	if why, code := t.eligible(ci.Attributes); why != "" {
		return nil, nil, 10 * pace, code, why
	}
	t.mu.Lock()
	if max := t.dp.maxRounds(); max > 0 && t.parts[ci.DeviceId] >= max {
		if t.round == r {
			r.capped[ci.DeviceId] = true
		}
		t.mu.Unlock()
		return nil, nil, 10 * pace, pb.RetryReason_RETRY_REASON_NOT_ELIGIBLE,
			fmt.Sprintf("device reached the task's cap of %d rounds (differential privacy)", max)
	}
	if t.round != r {
		t.mu.Unlock()
		return nil, nil, pace, pb.RetryReason_RETRY_REASON_ROUND_FULL, "between rounds"
	}
	until := max(0, r.row.Deadline.Sub(now))
	if seat, ok := r.assigned[ci.DeviceId]; ok && !r.reported[ci.DeviceId] {
		t.mu.Unlock()
		return withParticipant(r.plan, seat.Participant), r.tr.header, 0, 0, ""
	}
	if why := t.benched(ci.DeviceId, r.row.Round); why != "" {
		t.mu.Unlock()
		return nil, nil, min(until, 10*pace), pb.RetryReason_RETRY_REASON_NOT_ELIGIBLE, why
	}
	if !r.selecting || len(r.assigned) >= r.wanted || r.reported[ci.DeviceId] {
		t.mu.Unlock()
		// The next round opens about when this one closes.
		return nil, nil, min(until, 10*pace), pb.RetryReason_RETRY_REASON_ROUND_FULL, fmt.Sprintf("round %d is full", r.row.Round)
	}
	// Reserve the slot before the write so concurrent check-ins cannot overfill.
	r.assigned[ci.DeviceId] = store.Assignment{}
	t.mu.Unlock()
	key, err := t.c.deviceKey(t.c.ctx, ci.DeviceId)
	if errors.Is(err, ErrRevoked) || (key == nil && t.c.d.RequireEnrollment) {
		t.mu.Lock()
		delete(r.assigned, ci.DeviceId)
		t.mu.Unlock()
		why := "device is not enrolled"
		if err != nil {
			why = err.Error()
		}
		return nil, nil, 10 * pace, pb.RetryReason_RETRY_REASON_NOT_ELIGIBLE, why
	}

	ctx, cancel := context.WithTimeout(t.c.ctx, 5*time.Second)
	defer cancel()
	examples := ci.GetAttributes().GetExamplesAvailable()
	p, _, err := t.c.d.Store.Assign(ctx, t.id, r.row.Round, ci.DeviceId, examples, now)
	t.mu.Lock()
	if err != nil || t.round != r {
		delete(r.assigned, ci.DeviceId)
		t.mu.Unlock()
		if err != nil {
			t.log().Warn("assigning device", "device", ci.DeviceId, "err", err)
		}
		return nil, nil, pace, pb.RetryReason_RETRY_REASON_OVERLOADED, "try again"
	}
	r.assigned[ci.DeviceId] = store.Assignment{Participant: p, Examples: examples}
	if key != nil {
		r.keys[ci.DeviceId] = key
	}
	t.mu.Unlock()
	r.poke()
	r.planHanded(ci.DeviceId, p)
	return withParticipant(r.plan, p), r.tr.header, 0, 0, ""
}

// ErrRevoked marks a device whose enrollment was revoked: it is never
// selected, whatever RequireEnrollment says.
var ErrRevoked = errors.New("device enrollment revoked")

// deviceKey returns the device's enrolled key, nil for a device that is not
// enrolled (or when there is no registry), and an error wrapping ErrRevoked
// for a revoked one.
func (c *Coordinator) deviceKey(ctx context.Context, device string) (ed25519.PublicKey, error) {
	if c.d.DeviceKey == nil {
		return nil, nil
	}
	k, err := c.d.DeviceKey(ctx, device)
	if errors.Is(err, ErrRevoked) {
		return nil, err
	}
	if err != nil {
		return nil, nil
	}
	return k, nil
}

func withParticipant(plan *pb.RoundPlan, p uint32) *pb.RoundPlan {
	out := proto.Clone(plan).(*pb.RoundPlan)
	out.ParticipantId = p
	return out
}

// DefaultCheckInRate is the check-in rate a round's announcement spreads the
// woken fleet to by default. A check-in that is turned away costs the
// coordinator about 50 µs of CPU (one that takes a seat, with its store
// write, about 0.5 ms; profiled with 100 agents), so at this rate its
// workers are mostly idle. Fleets too large to wake at this rate within the
// pace window get the pace window, as before.
const DefaultCheckInRate = 1000

// MinCheckInSpread is the shortest spread an announcement gives: agents
// read a zero spread as a missing one (and wait up to a second).
const MinCheckInSpread = 5 * time.Millisecond

// announceSpread is the spread a round's announcement gives the devices it
// wakes (every device listening, whatever its tasks): long enough that
// their check-ins arrive at about CheckInRate, and no longer, since
// selection waits for them.
func (c *Coordinator) announceSpread() time.Duration {
	n, ok := c.seenFleet(c.now())
	if !ok {
		return c.d.PaceWindow
	}
	return checkInSpread(n, c.d.CheckInRate, c.d.PaceWindow)
}

// seenFleet counts the devices that checked in within SeenWindow of now.
// Within SeenWindow of its start it counts at least what the store had seen
// when it started, since a restarted coordinator has not heard from every
// device yet; ok is false while that count is unknown. Entries older than
// SeenWindow leave seen, at most once a deviceWriteInterval.
func (c *Coordinator) seenFleet(now time.Time) (n int, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now.Sub(c.swept) >= deviceWriteInterval {
		for id, at := range c.seen {
			if now.Sub(at) >= SeenWindow {
				delete(c.seen, id)
			}
		}
		c.swept = now
	}
	n = len(c.seen) // noteDevice enters every sighting here, written or not
	if now.Sub(c.started) < SeenWindow {
		if c.stored < 0 {
			return 0, false
		}
		n = max(n, c.stored)
	}
	return n, true
}

// checkInSpread is the time n check-ins take at rate per second, within
// [MinCheckInSpread, pace].
func checkInSpread(n int, rate float64, pace time.Duration) time.Duration {
	floor := min(MinCheckInSpread, pace)
	secs := float64(n) / rate
	if !(secs < pace.Seconds()) { // also a rate of 0 or NaN
		return max(pace, floor)
	}
	return max(time.Duration(secs*float64(time.Second)), floor)
}
