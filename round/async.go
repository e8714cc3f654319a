package round

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"time"
)

// Asynchronous buffered training (FedBuff: Nguyen et al., "Federated
// Learning with Buffered Asynchronous Aggregation", AISTATS 2022; Papaya:
// Huba et al., MLSys 2022). A task in async mode has no rounds that wait
// for their slowest device: up to Concurrency devices train at once, each
// on the model version that was current when it checked in; every report
// is folded into a buffer with a weight that falls with its staleness (how
// many versions were committed while it trained); every Buffer reports the
// server takes one step and commits a new version. A report more than
// MaxStaleness versions behind is refused, and a seat held past the
// report timeout is given up, so a device that never reports holds one
// seat of Concurrency for one timeout and sets no one's pace.
//
// Async is that bookkeeping as a state machine, like Cohort: the service
// asks it at each check-in, report and commit, and persists it
// (MarshalBinary) so that a restarted or failed-over server carries on.

// AsyncConfig sizes an async task.
type AsyncConfig struct {
	// Concurrency is C, the most devices training at once.
	Concurrency int
	// Buffer is K, the reports one server step takes.
	Buffer int
	// MaxStaleness is S: a report trained on a version more than S
	// versions before the current one is refused.
	MaxStaleness uint64
}

// Limits on AsyncConfig: a buffer is one secure aggregation instance at
// most, and staleness beyond a few hundred versions is noise.
const (
	MaxConcurrency  = 100_000
	MaxBuffer       = 10_000
	MaxMaxStaleness = 1_000
)

// Validate checks c.
func (c AsyncConfig) Validate() error {
	switch {
	case c.Concurrency < 1 || c.Concurrency > MaxConcurrency:
		return fmt.Errorf("round: async: concurrency %d, want 1..%d", c.Concurrency, MaxConcurrency)
	case c.Buffer < 1 || c.Buffer > MaxBuffer:
		return fmt.Errorf("round: async: buffer %d, want 1..%d", c.Buffer, MaxBuffer)
	case c.Buffer > c.Concurrency:
		return fmt.Errorf("round: async: a buffer of %d reports needs at least as many devices training at once, not %d", c.Buffer, c.Concurrency)
	case c.MaxStaleness > MaxMaxStaleness:
		return fmt.Errorf("round: async: max staleness %d, want at most %d", c.MaxStaleness, MaxMaxStaleness)
	}
	return nil
}

// StalenessWeight is the weight of a report s versions stale: FedBuff's
// polynomial staleness function 1/√(1+s) (Nguyen et al. 2022, §3, with
// exponent ½, the paper's choice), 1 for a fresh report.
func StalenessWeight(s uint64) float64 { return 1 / math.Sqrt(1+float64(s)) }

// AsyncSeat is a device training for an async task: on which version, and
// since when.
type AsyncSeat struct {
	Version uint64    `json:"version"`
	Since   time.Time `json:"since"`
	// Examples is what the device said it had at check-in; its report may
	// claim no more.
	Examples uint64 `json:"examples"`
}

// Buffered is a report in the current buffer.
type Buffered struct {
	Device    string  `json:"device"`
	Version   uint64  `json:"version"` // the version it trained on
	Staleness uint64  `json:"staleness"`
	Weight    float64 `json:"weight"` // StalenessWeight(Staleness)
}

// Async is an async task's state: the current version, the seats, and the
// reports folded into the buffer since the last step. Not safe for
// concurrent use.
type Async struct {
	cfg     AsyncConfig
	version uint64
	seats   map[string]AsyncSeat
	buffer  []Buffered
	// reported are the buffer's devices: one report per device a buffer,
	// so that no device weighs more than 1/Buffer of a step.
	reported map[string]bool
}

// NewAsync starts an async task's state at version (the versions its
// server steps committed so far).
func NewAsync(cfg AsyncConfig, version uint64) (*Async, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Async{cfg: cfg, version: version, seats: map[string]AsyncSeat{}, reported: map[string]bool{}}, nil
}

// Config is the configuration a was made with.
func (a *Async) Config() AsyncConfig { return a.cfg }

// Version is the current model version: the server steps committed.
func (a *Async) Version() uint64 { return a.version }

// Training counts the seats held.
func (a *Async) Training() int { return len(a.seats) }

// Seat is device's seat, if it holds one.
func (a *Async) Seat(device string) (AsyncSeat, bool) {
	s, ok := a.seats[device]
	return s, ok
}

// Buffer is the reports folded since the last step, in order.
func (a *Async) Buffer() []Buffered { return slices.Clone(a.buffer) }

// Full reports that the buffer holds Buffer reports: the service steps.
func (a *Async) Full() bool { return len(a.buffer) >= a.cfg.Buffer }

// AsyncOffer is the answer to a check-in.
type AsyncOffer struct {
	// Action is Replan (the device trains on Seat.Version already: it gets
	// that plan again), Reserve (a new seat, Seat: record it) or Defer.
	Action Action
	Seat   AsyncSeat
	Reason Reason // for Defer
	Detail string
}

// Offer decides a check-in of device, which has examples, at now. A device
// training already gets its seat again; a device whose report is in the
// current buffer waits for the step (one report a buffer); otherwise it
// gets a seat on the current version while fewer than Concurrency train.
func (a *Async) Offer(device string, examples uint64, now time.Time) AsyncOffer {
	if s, ok := a.seats[device]; ok {
		return AsyncOffer{Action: Replan, Seat: s}
	}
	if a.reported[device] {
		return AsyncOffer{Action: Defer, Reason: ReasonRoundFull,
			Detail: fmt.Sprintf("this device's report is in the buffer of version %d; it may train again after the next step", a.version+1)}
	}
	if len(a.seats) >= a.cfg.Concurrency {
		return AsyncOffer{Action: Defer, Reason: ReasonRoundFull,
			Detail: fmt.Sprintf("%d devices train already, the task's concurrency", len(a.seats))}
	}
	s := AsyncSeat{Version: a.version, Since: now, Examples: examples}
	a.seats[device] = s
	return AsyncOffer{Action: Reserve, Seat: s}
}

// Abandon empties the buffer without a step: the service lost its sum (a
// failed step, a restart). The version stays; the buffer's devices may
// train again.
func (a *Async) Abandon() {
	a.buffer = a.buffer[:0]
	clear(a.reported)
}

// Release gives up device's seat: recording it failed, the device said it
// cannot train, or it held the seat past the timeout (Expired).
func (a *Async) Release(device string) { delete(a.seats, device) }

// Expired lists, sorted, the devices that have held their seat longer than
// timeout at now; the service releases them.
func (a *Async) Expired(now time.Time, timeout time.Duration) []string {
	var out []string
	for d, s := range a.seats {
		if now.Sub(s.Since) > timeout {
			out = append(out, d)
		}
	}
	slices.Sort(out)
	return out
}

// NextExpiry is when the earliest seat expires with timeout; zero without
// seats.
func (a *Async) NextExpiry(timeout time.Duration) time.Time {
	var first time.Time
	for _, s := range a.seats {
		if t := s.Since.Add(timeout); first.IsZero() || t.Before(first) {
			first = t
		}
	}
	return first
}

// Check says whether the buffer takes a report of device trained on
// version, and with what staleness and weight, without changing anything:
// the service checks the report's contents between Check and Report.
func (a *Async) Check(device string, version uint64) (Buffered, error) {
	s, ok := a.seats[device]
	switch {
	case !ok && a.reported[device]:
		return Buffered{}, refuse(ClassDuplicate, "%s reported to this buffer already; one report a device a buffer", device)
	case !ok:
		return Buffered{}, refuse(ClassCohort, "%s holds no seat: check in for a plan first", device)
	case version != s.Version:
		return Buffered{}, refuse(ClassHeader, "the report trained on version %d, the seat of %s on version %d", version, device, s.Version)
	case version > a.version:
		return Buffered{}, refuse(ClassHeader, "version %d is ahead of the task's %d", version, a.version)
	}
	if err := a.Stale(version); err != nil {
		return Buffered{}, err
	}
	st := a.version - version
	return Buffered{Device: device, Version: version, Staleness: st, Weight: StalenessWeight(st)}, nil
}

// Stale refuses, with ClassStale, a report trained on version if that is
// more than MaxStaleness versions behind the current one: also the report
// of a seat that Step gave up.
func (a *Async) Stale(version uint64) error {
	if st := a.version - min(version, a.version); st > a.cfg.MaxStaleness {
		return refuse(ClassStale, "the report trained on version %d, %d versions behind the current %d; the task takes reports at most %d behind",
			version, st, a.version, a.cfg.MaxStaleness)
	}
	return nil
}

// Report folds device's report on version into the buffer (Check first)
// and frees its seat.
func (a *Async) Report(device string, version uint64) (Buffered, error) {
	b, err := a.Check(device, version)
	if err != nil {
		if r, ok := err.(*Refusal); ok && r.Class == ClassStale {
			// Its report can never be taken: the seat is free for another.
			delete(a.seats, device)
		}
		return b, err
	}
	delete(a.seats, device)
	a.reported[device] = true
	a.buffer = append(a.buffer, b)
	return b, nil
}

// Step records the server step the full buffer made: the version advances
// and the buffer empties. It returns, sorted, the devices whose seats fell
// more than MaxStaleness behind: their reports can no longer be taken, and
// the service frees their seats and tells them.
func (a *Async) Step() (stale []string, err error) {
	if !a.Full() {
		return nil, fmt.Errorf("round: async: a step with %d of %d reports buffered", len(a.buffer), a.cfg.Buffer)
	}
	a.version++
	a.buffer = a.buffer[:0]
	clear(a.reported)
	for d, s := range a.seats {
		if a.version-s.Version > a.cfg.MaxStaleness {
			stale = append(stale, d)
			delete(a.seats, d)
		}
	}
	slices.Sort(stale)
	return stale, nil
}

// asyncDoc is Async's serialized form.
type asyncDoc struct {
	Version uint64               `json:"version"`
	Seats   map[string]AsyncSeat `json:"seats"`
	Buffer  []Buffered           `json:"buffer"`
}

// MarshalBinary serializes the state (not the config, which is the task's).
func (a *Async) MarshalBinary() ([]byte, error) {
	return json.Marshal(asyncDoc{Version: a.version, Seats: a.seats, Buffer: a.buffer})
}

// UnmarshalBinary restores what MarshalBinary wrote into a (made by
// NewAsync with the task's config). State no Async reaches is refused with
// ErrState: a seat on a future version, a buffered report that is stale,
// of the future or weighted otherwise, a device twice in the buffer, a
// buffer past full, more seats than the concurrency.
func (a *Async) UnmarshalBinary(b []byte) error {
	var doc asyncDoc
	if err := json.Unmarshal(b, &doc); err != nil {
		return fmt.Errorf("%w: %v", ErrState, err)
	}
	if len(doc.Seats) > a.cfg.Concurrency || len(doc.Buffer) > a.cfg.Buffer {
		return fmt.Errorf("%w: %d seats and %d buffered for concurrency %d and buffer %d", ErrState, len(doc.Seats), len(doc.Buffer),
			a.cfg.Concurrency, a.cfg.Buffer)
	}
	n := Async{cfg: a.cfg, version: doc.Version, seats: map[string]AsyncSeat{}, reported: map[string]bool{}}
	for d, s := range doc.Seats {
		if err := checkDevice(d); err != nil {
			return err
		}
		if s.Version > doc.Version {
			return fmt.Errorf("%w: %s holds a seat on version %d of %d", ErrState, d, s.Version, doc.Version)
		}
		n.seats[d] = s
	}
	for _, r := range doc.Buffer {
		if err := checkDevice(r.Device); err != nil {
			return err
		}
		if n.reported[r.Device] || n.seats[r.Device] != (AsyncSeat{}) || r.Version > doc.Version || r.Staleness != doc.Version-r.Version ||
			r.Staleness > a.cfg.MaxStaleness || r.Weight != StalenessWeight(r.Staleness) {
			return fmt.Errorf("%w: buffered report %+v at version %d", ErrState, r, doc.Version)
		}
		n.reported[r.Device] = true
		n.buffer = append(n.buffer, r)
	}
	*a = n
	return nil
}
