package round

import (
	"fmt"
	"iter"
	"maps"
	"slices"
	"strings"
	"time"
)

// Cohort is an open round's selection and membership: which devices hold a
// seat or have one reserved, which reported, which failed and why, which the
// task's participation cap turned away. It decides check-ins (Offer) and
// what the round's close sees (Plain, Failures, Silent). It has no lock: the
// caller serializes its use. Its state serializes and restores exactly
// (MarshalBinary), so a round can be carried over to another server.
type Cohort struct {
	round     uint64
	wanted    int
	selecting bool
	deadline  time.Time
	pace      time.Duration
	seats     map[string]Seat
	reserved  map[string]bool
	reported  map[string]bool
	failures  map[string]string
	capped    map[string]bool
	separated map[string]uint64 // device → the step it last contributed to
}

// CohortConfig is what a round's cohort is started with.
type CohortConfig struct {
	Round        uint64
	Wanted       int       // seats to fill: the cohort target times over-selection
	SelectionEnd time.Time // selection closes then, if not full before
	Deadline     time.Time // reports are due
	// Pace is the server's pace window, the unit of the waits Offer hands out.
	Pace time.Duration
}

// NewCohort starts a round's cohort at now. resumed are the seats a store
// already holds for the round (a round resumed after a restart); selection
// stays open only while seats are missing and SelectionEnd has not come.
func NewCohort(cfg CohortConfig, now time.Time, resumed map[string]Seat) *Cohort {
	c := &Cohort{round: cfg.Round, wanted: cfg.Wanted, deadline: cfg.Deadline, pace: cfg.Pace, seats: map[string]Seat{},
		reserved: map[string]bool{}, reported: map[string]bool{}, failures: map[string]string{}, capped: map[string]bool{},
		separated: map[string]uint64{}}
	for d, s := range resumed {
		c.seats[d] = s
	}
	c.selecting = len(c.seats) < cfg.Wanted && now.Before(cfg.SelectionEnd)
	return c
}

// Reason is why a device is told to wait.
type Reason int

// The reasons Offer gives.
const (
	ReasonRoundFull      Reason = iota + 1 // no seat is free, or selection is over
	ReasonNotEligible                      // the task does not take this device (now)
	ReasonUnsupportedABI                   // the device cannot run the task's module
)

// Action is what a check-in gets.
type Action int

// The actions.
const (
	Defer   Action = iota // wait Offer.Wait and check in again
	Replan                // the device holds Offer.Seat: it gets its plan again
	Reserve               // a seat is reserved: record it, then Seat or Release it
)

// Offer is the cohort's answer to a check-in.
type Offer struct {
	Action Action
	Seat   Seat // the device's seat, for Replan
	Wait   time.Duration
	Reason Reason
	Detail string
}

// Attributes are what a device says of itself at check-in.
type Attributes struct {
	ABIs      []uint32 // module ABI versions it runs
	Examples  uint64   // examples it has
	Charging  bool
	Idle      bool
	Unmetered bool
	Class     string
}

// Eligibility is what a task asks of its devices.
type Eligibility struct {
	ABI              uint32 // the module's ABI version
	MinExamples      uint64 // at least 1 whatever is set
	RequireCharging  bool
	RequireIdle      bool
	RequireUnmetered bool
	Classes          []string // device classes taken; empty takes every class
	// MaxRounds caps the rounds one device contributes to (differential
	// privacy's participation cap); 0 is no cap.
	MaxRounds int
	// MinSeparation is the fewest training steps between two a device
	// contributes to (correlated-noise DP's minimum separation b); 0 is
	// none. Step is the step the open round's commit would be.
	MinSeparation int
	Step          uint64
}

// Participation rules that turn a device away (TurnedAway.Rule).
const (
	RuleMaxRounds     = "max_rounds"
	RuleMinSeparation = "min_separation"
)

// TurnedAway is a device a participation rule turned away from a round.
type TurnedAway struct {
	Device string
	Rule   string // RuleMaxRounds or RuleMinSeparation
	// LastStep is the step of its last contribution (RuleMinSeparation).
	LastStep uint64
}

// separatedUntil is the first step a device that last contributed to step
// last may contribute to again, under e's minimum separation.
func (e Eligibility) separatedUntil(last uint64) uint64 {
	return last + uint64(e.MinSeparation)
}

// Admit applies the task's device rules (Check) and its participation
// rules to cand: why the task does not take it now ("" when it does), and
// the participation rule that turned it away (RuleMaxRounds,
// RuleMinSeparation; "" for the device rules).
func (e Eligibility) Admit(cand Candidate) (why string, reason Reason, rule string) {
	if why, reason := e.Check(cand.Attributes); why != "" {
		return why, reason, ""
	}
	if e.MaxRounds > 0 && cand.Rounds >= e.MaxRounds {
		return fmt.Sprintf("device reached the task's cap of %d rounds (differential privacy)", e.MaxRounds), ReasonNotEligible, RuleMaxRounds
	}
	if e.MinSeparation > 0 && cand.LastStep > 0 && e.Step < e.separatedUntil(cand.LastStep) {
		return fmt.Sprintf("device took part in training step %d; the task's minimum separation of %d steps lets it take part again from step %d, and this round is step %d (differential privacy)",
			cand.LastStep, e.MinSeparation, e.separatedUntil(cand.LastStep), e.Step), ReasonNotEligible, RuleMinSeparation
	}
	return "", 0, ""
}

// Check says why the task does not take a device with attributes a, or ""
// when it does.
func (e Eligibility) Check(a Attributes) (string, Reason) {
	if !slices.Contains(a.ABIs, e.ABI) {
		return fmt.Sprintf("device does not support module ABI v%d", e.ABI), ReasonUnsupportedABI
	}
	var why string
	switch minEx := max(e.MinExamples, 1); {
	case a.Examples < minEx:
		why = fmt.Sprintf("needs at least %d examples, device has %d", minEx, a.Examples)
	case e.RequireCharging && !a.Charging:
		why = "task requires charging devices"
	case e.RequireIdle && !a.Idle:
		why = "task requires idle devices"
	case e.RequireUnmetered && !a.Unmetered:
		why = "task requires unmetered networks"
	case len(e.Classes) > 0 && !slices.Contains(e.Classes, a.Class):
		why = fmt.Sprintf("device class %q not in %v", a.Class, e.Classes)
	}
	return why, ReasonNotEligible
}

// Describe states a round of kind and who could join it, as the audit log
// records it when the round opens.
func (e Eligibility) Describe(kind Kind) string {
	name := "train"
	if kind == Evaluate {
		name = "evaluate"
	}
	parts := []string{"kind=" + name, fmt.Sprintf("min_examples=%d", max(e.MinExamples, 1)), fmt.Sprintf("abi=%d", e.ABI)}
	for _, c := range []struct {
		on   bool
		name string
	}{{e.RequireCharging, "charging"}, {e.RequireIdle, "idle"}, {e.RequireUnmetered, "unmetered"}} {
		if c.on {
			parts = append(parts, c.name)
		}
	}
	if len(e.Classes) > 0 {
		parts = append(parts, "device_classes="+strings.Join(e.Classes, "|"))
	}
	return strings.Join(parts, " ")
}

// Candidate is a device checking in, with what the task knows of it.
type Candidate struct {
	Device     string
	Attributes Attributes
	// Rounds is how many committed rounds it contributed to, counted while
	// the task caps participation; LastStep, the training step of the last
	// (0: none), while it has a minimum separation.
	Rounds   int
	LastStep uint64
	// Benched says why it sits this round out (NoShow.Benched), "" if not.
	Benched string
}

// Offer decides a check-in at now. In order: a device the task does not
// take waits 10 pace windows, as does one at the participation cap (noted,
// for the reason an abandoned round gives); a device holding a seat and not
// yet reported gets its plan again (it may have restarted); a benched
// device, or any when no seat is free, waits until the round is expected to
// close (at most 10 pace windows); otherwise a seat is reserved.
func (c *Cohort) Offer(now time.Time, e Eligibility, cand Candidate) Offer {
	long := 10 * c.pace
	d := cand.Device
	if why, reason, rule := e.Admit(cand); why != "" {
		switch rule {
		case RuleMaxRounds:
			c.capped[d] = true
		case RuleMinSeparation:
			c.separated[d] = cand.LastStep
		}
		return Offer{Action: Defer, Wait: long, Reason: reason, Detail: why}
	}
	if s, ok := c.seats[d]; ok && !c.reported[d] {
		return Offer{Action: Replan, Seat: s}
	}
	untilClose := min(max(0, c.deadline.Sub(now)), long)
	if cand.Benched != "" {
		return Offer{Action: Defer, Wait: untilClose, Reason: ReasonNotEligible, Detail: cand.Benched}
	}
	if !c.selecting || c.Assigned() >= c.wanted || c.reported[d] || c.reserved[d] {
		return Offer{Action: Defer, Wait: untilClose, Reason: ReasonRoundFull, Detail: fmt.Sprintf("round %d is full", c.round)}
	}
	c.reserved[d] = true
	return Offer{Action: Reserve}
}

// Seat turns device's reservation into seat s; it reports false when the
// device held no reservation.
func (c *Cohort) Seat(device string, s Seat) bool {
	if !c.reserved[device] {
		return false
	}
	delete(c.reserved, device)
	c.seats[device] = s
	return true
}

// Join seats device without an offer: an asynchronous buffer's cohort is
// the devices whose reports it took (Async), each seated as its report is.
func (c *Cohort) Join(device string, s Seat) {
	delete(c.reserved, device)
	c.seats[device] = s
}

// Release gives up device's reservation: recording the seat failed.
func (c *Cohort) Release(device string) { delete(c.reserved, device) }

// Wanted is the number of seats the round fills.
func (c *Cohort) Wanted() int { return c.wanted }

// Selecting reports whether selection is open.
func (c *Cohort) Selecting() bool { return c.selecting }

// EndSelection closes selection.
func (c *Cohort) EndSelection() { c.selecting = false }

// Assigned counts seats and reservations: what selection has handed out.
func (c *Cohort) Assigned() int { return len(c.seats) + len(c.reserved) }

// Seated counts the seats recorded.
func (c *Cohort) Seated() int { return len(c.seats) }

// Reported counts the reports counted.
func (c *Cohort) Reported() int { return len(c.reported) }

// Capped counts the devices the participation cap turned away.
func (c *Cohort) Capped() int { return len(c.capped) }

// TurnedAway lists the devices the participation rules turned away from the
// round, by device.
func (c *Cohort) TurnedAway() []TurnedAway {
	out := make([]TurnedAway, 0, len(c.capped)+len(c.separated))
	for _, d := range sortedKeys(c.capped) {
		out = append(out, TurnedAway{Device: d, Rule: RuleMaxRounds})
	}
	for _, d := range sortedKeys(c.separated) {
		out = append(out, TurnedAway{Device: d, Rule: RuleMinSeparation, LastStep: c.separated[d]})
	}
	return out
}

// SeatOf returns device's seat, if it holds one.
func (c *Cohort) SeatOf(device string) (Seat, bool) {
	s, ok := c.seats[device]
	return s, ok
}

// Seats ranges over every seat, by device, without copying them: the
// secure round reads them at every event while selection is open.
func (c *Cohort) Seats() iter.Seq2[string, Seat] { return maps.All(c.seats) }

// Standing is what CheckSender needs of device; the caller adds OverQuota.
func (c *Cohort) Standing(device string) Standing {
	s, ok := c.seats[device]
	return Standing{Seat: s, Seated: ok, Reported: c.reported[device]}
}

// Report counts device's report.
func (c *Cohort) Report(device string) { c.reported[device] = true }

// HasReported reports whether device's report was counted.
func (c *Cohort) HasReported(device string) bool { return c.reported[device] }

// ReportedDevices lists the devices whose reports were counted, sorted.
func (c *Cohort) ReportedDevices() []string { return sortedKeys(c.reported) }

// Fail keeps why a seated device did not contribute: the first reason
// only, and none for a device that reported or holds no seat. It reports
// whether the reason was kept.
func (c *Cohort) Fail(device, why string) bool {
	if _, in := c.seats[device]; !in || c.reported[device] {
		return false
	}
	if _, had := c.failures[device]; had {
		return false
	}
	c.failures[device] = why
	return true
}

// Failures are why seated devices that did not report failed, by device.
func (c *Cohort) Failures() map[string]string {
	out := map[string]string{}
	for d, why := range c.failures {
		if _, in := c.seats[d]; in && !c.reported[d] {
			out[d] = why
		}
	}
	return out
}

// Settled counts the seated devices the round no longer waits for: those
// that reported, and those whose plan failed or whose report was refused.
func (c *Cohort) Settled() int {
	n := 0
	for d := range c.seats {
		if _, failed := c.failures[d]; c.reported[d] || failed {
			n++
		}
	}
	return n
}

// Silent lists the seated devices that neither reported nor failed, sorted:
// at a close that waited for them, they held a seat in silence.
func (c *Cohort) Silent() []string {
	var out []string
	for d := range c.seats {
		if _, failed := c.failures[d]; !c.reported[d] && !failed {
			out = append(out, d)
		}
	}
	slices.Sort(out)
	return out
}

// Plain is what a plaintext round's close decision sees now. A full cohort
// ends selection first.
func (c *Cohort) Plain(cohortTarget, reportGoal int, deadlinePassed bool) Plain {
	if c.Assigned() >= c.wanted {
		c.selecting = false
	}
	return Plain{CohortTarget: cohortTarget, ReportGoal: reportGoal, Assigned: c.Assigned(), Reported: len(c.reported),
		Settled: c.Settled(), Selecting: c.selecting, DeadlinePassed: deadlinePassed}
}

// CloseSelection ends selection and says why the round must be abandoned:
// fewer seats than the report goal, or than minCohort (a secure round's
// minimum; 0 for none). maxRounds is the task's participation cap, named
// when capped devices explain the shortfall.
func (c *Cohort) CloseSelection(reportGoal, minCohort, maxRounds int) string {
	c.selecting = false
	n := c.Assigned()
	if n >= reportGoal && n >= minCohort {
		return ""
	}
	why := fmt.Sprintf("selection closed with %d devices, below the report goal %d", n, reportGoal)
	if minCohort > reportGoal {
		why = fmt.Sprintf("selection closed with %d devices, below the report goal %d or the secure aggregation minimum %d", n, reportGoal, minCohort)
	}
	if k := len(c.capped); k > 0 {
		why += fmt.Sprintf("; %d devices checked in but had reached the task's cap of %d rounds each", k, maxRounds)
	}
	if k := len(c.separated); k > 0 {
		why += fmt.Sprintf("; %d devices checked in before their minimum separation had passed", k)
	}
	return why
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// MaxCheckInBytes bounds a check-in message; attributes are small.
const MaxCheckInBytes = 16 << 10

// CheckCheckInSize says why a check-in of n bytes is turned away unread,
// or "" when it is read.
func CheckCheckInSize(n int) string {
	if n > MaxCheckInBytes {
		return fmt.Sprintf("check-in of %d bytes exceeds %d", n, MaxCheckInBytes)
	}
	return ""
}

// CheckCheckInDevice says why a check-in naming device body on the check-in
// subject of device subject is turned away, or "" when it is not. NATS lets
// a device publish only on its own check-in subject, so the body's device is
// never trusted on its own.
func CheckCheckInDevice(subject, body string) string {
	if body != subject {
		return fmt.Sprintf("check-in names device %q on the subject of device %q; a device checks in only as itself", body, subject)
	}
	return ""
}
