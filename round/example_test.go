package round_test

import (
	"fmt"
	"time"

	"github.com/fleetlearn/fleetlearn/round"
)

// A round of two seats: check-ins take seats (the adapter records each in
// its store between Offer and Seat), reports come in, and the close decision
// follows; the cohort's state can be carried to another server at any point.
func Example() {
	start := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	c := round.NewCohort(round.CohortConfig{Round: 1, Wanted: 2, SelectionEnd: start.Add(time.Minute),
		Deadline: start.Add(5 * time.Minute), Pace: 2 * time.Second}, start, nil)
	task := round.Eligibility{ABI: 3, MinExamples: 10}
	phone := func(id string, examples uint64) round.Candidate {
		return round.Candidate{Device: id, Attributes: round.Attributes{ABIs: []uint32{3}, Examples: examples}}
	}

	for i, cand := range []round.Candidate{phone("a", 50), phone("b", 5), phone("c", 80), phone("d", 90)} {
		switch o := c.Offer(start, task, cand); o.Action {
		case round.Reserve:
			c.Seat(cand.Device, round.Seat{Participant: uint32(i + 1), Examples: cand.Attributes.Examples})
			fmt.Printf("%s: seated\n", cand.Device)
		case round.Defer:
			fmt.Printf("%s: wait %v (%s)\n", cand.Device, o.Wait, o.Detail)
		}
	}

	// Device a reports 40 examples of the 50 it declared; c claims more than it has.
	fmt.Println(round.CheckExamples(40, c.Standing("a").Seat))
	fmt.Println(round.CheckExamples(500, c.Standing("c").Seat))
	c.Report("a")
	c.Fail("c", "report refused: num_examples 500 not in [1, 80]")

	state, _ := c.MarshalBinary()
	var carried round.Cohort
	if err := carried.UnmarshalBinary(state); err != nil {
		fmt.Println(err)
	}
	outcome, reason, _ := carried.Plain(0, 1, false).Decide()
	fmt.Println(outcome == round.Commit, reason)
	// Output:
	// a: seated
	// b: wait 20s (needs at least 10 examples, device has 5)
	// c: seated
	// d: wait 20s (round 1 is full)
	// <nil>
	// report refused: num_examples 500 not in [1, 80] (examples available at check-in)
	// true every selected device reported or failed
}
