package round

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// cohortVersion is the format of a serialized cohort; a restore refuses any
// other, since reading a newer server's state wrongly would seat devices
// twice or lose reports.
const cohortVersion = 1

// MaxDeviceIDSize bounds a device name in a restored cohort.
const MaxDeviceIDSize = 256

// ErrState marks a serialized cohort that cannot be restored.
var ErrState = errors.New("round: invalid cohort state")

type cohortDoc struct {
	Version   int               `json:"version"`
	Round     uint64            `json:"round"`
	Wanted    int               `json:"wanted"`
	Selecting bool              `json:"selecting"`
	Deadline  time.Time         `json:"deadline"`
	Pace      time.Duration     `json:"pace_ns"`
	Seats     map[string]Seat   `json:"seats"`
	Reserved  []string          `json:"reserved"`
	Reported  []string          `json:"reported"`
	Failures  map[string]string `json:"failures"`
	Capped    []string          `json:"capped"`
	// Separated is omitted when empty, so that a cohort without it
	// serializes as before.
	Separated map[string]uint64 `json:"separated,omitempty"`
}

// MarshalBinary serializes the cohort: the same state always gives the same
// bytes (maps in key order, lists sorted, times in UTC).
func (c *Cohort) MarshalBinary() ([]byte, error) {
	return json.Marshal(cohortDoc{Version: cohortVersion, Round: c.round, Wanted: c.wanted, Selecting: c.selecting,
		Deadline: c.deadline.UTC(), Pace: c.pace, Seats: c.seats, Reserved: sortedKeys(c.reserved),
		Reported: sortedKeys(c.reported), Failures: c.failures, Capped: sortedKeys(c.capped), Separated: c.separated})
}

// UnmarshalBinary restores a cohort MarshalBinary serialized. State that no
// cohort could reach (a report from a device without a seat, a device both
// seated and reserved, a negative size) is refused with ErrState.
func (c *Cohort) UnmarshalBinary(b []byte) error {
	var doc cohortDoc
	if err := json.Unmarshal(b, &doc); err != nil {
		return fmt.Errorf("%w: %v", ErrState, err)
	}
	if doc.Version != cohortVersion {
		return fmt.Errorf("%w: version %d, this server reads version %d", ErrState, doc.Version, cohortVersion)
	}
	if doc.Wanted < 0 || doc.Pace < 0 {
		return fmt.Errorf("%w: wanted %d and pace %v must not be negative", ErrState, doc.Wanted, doc.Pace)
	}
	n := Cohort{round: doc.Round, wanted: doc.Wanted, selecting: doc.Selecting, deadline: doc.Deadline, pace: doc.Pace,
		seats: map[string]Seat{}, reserved: map[string]bool{}, reported: map[string]bool{},
		failures: map[string]string{}, capped: map[string]bool{}, separated: map[string]uint64{}}
	for d, s := range doc.Seats {
		if err := checkDevice(d); err != nil {
			return err
		}
		n.seats[d] = s
	}
	// A reservation is not a seat yet; a report needs a seat; the cap turns
	// away seated and unseated devices alike.
	sets := []struct {
		name string
		list []string
		into map[string]bool
		ok   func(seated bool) bool
		bad  string // what a device failing ok is
	}{
		{"reserved", doc.Reserved, n.reserved, func(s bool) bool { return !s }, "both reserved and seated"},
		{"reported", doc.Reported, n.reported, func(s bool) bool { return s }, "reported without a seat"},
		{"capped", doc.Capped, n.capped, func(bool) bool { return true }, ""},
	}
	for _, set := range sets {
		for _, d := range set.list {
			if err := checkDevice(d); err != nil {
				return err
			}
			if _, seated := n.seats[d]; !set.ok(seated) {
				return fmt.Errorf("%w: device %q is %s", ErrState, d, set.bad)
			}
			if set.into[d] {
				return fmt.Errorf("%w: device %q is %s twice", ErrState, d, set.name)
			}
			set.into[d] = true
		}
	}
	for d, step := range doc.Separated {
		if err := checkDevice(d); err != nil {
			return err
		}
		if step == 0 {
			return fmt.Errorf("%w: device %q turned away for a contribution at step 0", ErrState, d)
		}
		n.separated[d] = step
	}
	for d, why := range doc.Failures {
		if _, in := n.seats[d]; !in {
			return fmt.Errorf("%w: device %q failed without a seat", ErrState, d)
		}
		n.failures[d] = why
	}
	*c = n
	return nil
}

func checkDevice(d string) error {
	if d == "" || len(d) > MaxDeviceIDSize {
		return fmt.Errorf("%w: device name of %d bytes, want 1-%d", ErrState, len(d), MaxDeviceIDSize)
	}
	return nil
}
