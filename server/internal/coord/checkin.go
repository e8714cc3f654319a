package coord

import (
	"context"
	"crypto/ed25519"
	"errors"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/round"
	"github.com/fleetlearn/fleetlearn/wasm"
)

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
	if why := round.CheckCheckInSize(len(b)); why != "" {
		c.d.Metrics.CheckIns.WithLabelValues("invalid").Inc()
		return retry(10*pace, pb.RetryReason_RETRY_REASON_NOT_ELIGIBLE, why), nil
	}
	var ci pb.CheckIn
	if err := proto.Unmarshal(b, &ci); err != nil {
		c.d.Metrics.CheckIns.WithLabelValues("invalid").Inc()
		return retry(10*pace, pb.RetryReason_RETRY_REASON_NOT_ELIGIBLE, "malformed check-in: "+err.Error()), nil
	}
	if why := round.CheckCheckInDevice(device, ci.DeviceId); why != "" {
		c.d.Metrics.CheckIns.WithLabelValues("invalid").Inc()
		return retry(10*pace, pb.RetryReason_RETRY_REASON_NOT_ELIGIBLE, why), nil
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

// eligibility is what the task asks of devices, as the round engine reads it.
func (t *taskRun) eligibility() round.Eligibility {
	e := t.spec.GetEligibility()
	return round.Eligibility{ABI: t.moduleABI(), MinExamples: e.GetMinExamples(), RequireCharging: e.GetRequireCharging(),
		RequireIdle: e.GetRequireIdle(), RequireUnmetered: e.GetRequireUnmetered(), Classes: e.GetDeviceClasses(),
		MaxRounds: t.dp.maxRounds(), MinSeparation: t.dp.minSeparation()}
}

// moduleABI is the ABI the task's module declared when it was registered;
// modules registered before the registry recorded it are v1.
func (t *taskRun) moduleABI() uint32 {
	if v := t.spec.GetModule().GetAbiVersion(); v != 0 {
		return v
	}
	return wasm.MinABIVersion
}

func attributes(a *pb.DeviceAttributes) round.Attributes {
	return round.Attributes{ABIs: a.GetSupportedAbiVersions(), Examples: a.GetExamplesAvailable(), Charging: a.GetCharging(),
		Idle: a.GetIdle(), Unmetered: a.GetUnmetered(), Class: a.GetDeviceClass()}
}

var retryReasons = map[round.Reason]pb.RetryReason{
	round.ReasonRoundFull:      pb.RetryReason_RETRY_REASON_ROUND_FULL,
	round.ReasonNotEligible:    pb.RetryReason_RETRY_REASON_NOT_ELIGIBLE,
	round.ReasonUnsupportedABI: pb.RetryReason_RETRY_REASON_UNSUPPORTED_ABI,
}

// offer puts a check-in to the open round's cohort (round.Cohort.Offer) and
// does what it decides: hand the plan, with the headers of its reply, or
// record a reserved seat in the store, or say how long to wait.
func (t *taskRun) offer(ci *pb.CheckIn, now time.Time) (*pb.RoundPlan, nats.Header, time.Duration, pb.RetryReason, string) {
	pace := t.c.d.PaceWindow
	// The task's settings (spec, dp) are written while the runner loads; an
	// open round, seen under mu, means loading is over and they are fixed.
	t.mu.Lock()
	r := t.round
	if r == nil {
		t.mu.Unlock()
		return nil, nil, pace, pb.RetryReason_RETRY_REASON_ROUND_FULL, "between rounds"
	}
	t.mu.Unlock()
	if t.async != nil {
		return t.offerAsync(ci, now, r)
	}
	return t.offerCohort(ci, now, r)
}

// offerCohort is offer to round r's cohort.
func (t *taskRun) offerCohort(ci *pb.CheckIn, now time.Time, r *roundRun) (*pb.RoundPlan, nats.Header, time.Duration, pb.RetryReason, string) {
	pace := t.c.d.PaceWindow
	device := ci.DeviceId
	t.mu.Lock()
	var benched string
	if ns, ok := t.noShows[device]; ok {
		benched = ns.Benched(r.row.Round)
	}
	e := t.eligibility()
	e.Step = r.step
	part := t.parts[device]
	o := r.cohort.Offer(now, e, round.Candidate{Device: device, Attributes: attributes(ci.Attributes),
		Rounds: part.Rounds, LastStep: part.LastStep, Benched: benched})
	t.mu.Unlock()
	switch o.Action {
	case round.Defer:
		return nil, nil, o.Wait, retryReasons[o.Reason], o.Detail
	case round.Replan:
		return r.planFor(o.Seat.Participant), r.tr.header, 0, 0, ""
	}
	// A reserved seat: concurrent check-ins cannot overfill the cohort
	// while the store records it.
	key, why := t.c.seatKey(device)
	if why != "" {
		t.mu.Lock()
		r.cohort.Release(device)
		t.mu.Unlock()
		return nil, nil, 10 * pace, pb.RetryReason_RETRY_REASON_NOT_ELIGIBLE, why
	}

	ctx, cancel := context.WithTimeout(t.c.ctx, 5*time.Second)
	defer cancel()
	examples := ci.GetAttributes().GetExamplesAvailable()
	p, _, err := t.c.d.Store.Assign(ctx, t.id, r.row.Round, device, examples, now)
	t.mu.Lock()
	if err != nil || t.round != r {
		r.cohort.Release(device)
		t.mu.Unlock()
		if err != nil {
			t.log().Warn("assigning device", "device", device, "err", err)
		}
		return nil, nil, pace, pb.RetryReason_RETRY_REASON_OVERLOADED, "try again"
	}
	r.cohort.Seat(device, round.Seat{Participant: p, Examples: examples})
	if key != nil {
		r.keys[device] = key
	}
	t.mu.Unlock()
	r.poke()
	r.planHanded(device, p)
	return r.planFor(p), r.tr.header, 0, 0, ""
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

// seatKey is the key a device taking a seat signs with, or why it may not
// take one: revoked, or not enrolled where enrollment is required.
func (c *Coordinator) seatKey(device string) (ed25519.PublicKey, string) {
	key, err := c.deviceKey(c.ctx, device)
	switch {
	case errors.Is(err, ErrRevoked):
		return nil, err.Error()
	case key == nil && c.d.RequireEnrollment:
		return nil, "device is not enrolled"
	}
	return key, ""
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
