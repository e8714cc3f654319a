package coord

import "fmt"

// No-shows. A device that takes a seat and then stays silent — no report,
// no failure — holds the round to its report deadline (or a secure stage
// to its timeout) whenever the round needs every seat, and any enrolled
// device can do it every round. So a device that held a seat in silence
// through a round that had to wait out its timer sits out the task's next
// rounds: 1 after its first such round, then 2, 4, … up to maxBench after
// each further one; a round it reports in clears its record. A
// round that closed early (its cohort target reached) waited for no one,
// and its silent devices are not counted. The record lives with the task's
// runner: a restarted server starts it afresh.

// maxBench bounds the rounds a device sits out for one no-show.
const maxBench = 64

// noShow is a device's record of silent seats.
type noShow struct {
	strikes int    // silent seats since it last reported
	last    uint64 // the round of the latest
	until   uint64 // it sits out every round up to this one
}

// benchNoShows updates the record at r's close. Called with t.mu held.
func (t *taskRun) benchNoShows(r *roundRun) {
	for d := range r.assigned {
		_, failed := r.failures[d]
		switch {
		case r.reported[d]:
			delete(t.noShows, d)
		case failed || !r.waitedOut:
		default:
			if t.noShows == nil {
				t.noShows = map[string]*noShow{}
			}
			ns := t.noShows[d]
			if ns == nil {
				ns = &noShow{}
				t.noShows[d] = ns
			}
			ns.strikes++
			ns.last = r.row.Round
			ns.until = r.row.Round + uint64(min(1<<min(ns.strikes-1, 16), maxBench))
			t.log().Info("device held a seat in silence; it sits rounds out", "round", r.row.Round, "device", d,
				"strikes", ns.strikes, "until_round", ns.until)
		}
	}
}

// benched says why device may not take a seat in round, or "". Called with
// t.mu held.
func (t *taskRun) benched(device string, round uint64) string {
	ns := t.noShows[device]
	if ns == nil || round > ns.until {
		return ""
	}
	return fmt.Sprintf("device held a seat in round %d without reporting or failing (its seat no. %d in silence since it last reported); it sits out rounds up to %d",
		ns.last, ns.strikes, ns.until)
}
