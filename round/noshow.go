package round

import "fmt"

// MaxBench bounds the rounds a device sits out for one no-show.
const MaxBench = 64

// NoShow is a device's record of seats it held in silence: a device that
// takes a seat and neither reports nor fails holds the round to its
// deadline, and could do so every round. Each such seat benches it for
// twice as many rounds as the last, up to MaxBench; a report clears the
// record.
type NoShow struct {
	Strikes int    // silent seats since it last reported
	Last    uint64 // the round of the latest
	Until   uint64 // it sits out every round up to this one
}

// Strike records a silent seat in round.
func (n NoShow) Strike(round uint64) NoShow {
	n.Strikes++
	n.Last = round
	n.Until = round + uint64(min(1<<min(n.Strikes-1, 16), MaxBench))
	return n
}

// Benched says why the device sits out round, or "" when it does not.
func (n NoShow) Benched(round uint64) string {
	if n.Strikes == 0 || round > n.Until {
		return ""
	}
	return fmt.Sprintf("device held a seat in round %d without reporting or failing (its seat no. %d in silence since it last reported); it sits out rounds up to %d",
		n.Last, n.Strikes, n.Until)
}
