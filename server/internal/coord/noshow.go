package coord

import "github.com/fleetlearn/fleetlearn/round"

// No-shows. A device that takes a seat and then stays silent — no report,
// no failure — holds the round to its report deadline (or a secure stage
// to its timeout) whenever the round needs every seat, and any enrolled
// device can do it every round. So a device that held a seat in silence
// through a round that had to wait out its timer sits out the task's next
// rounds (round.NoShow); a round it reports in clears its record. A round
// that closed early (its cohort target reached) waited for no one, and its
// silent devices are not counted. The record lives with the task's runner:
// a restarted server starts it afresh.

// benchNoShows updates the record at r's close. Called with t.mu held.
func (t *taskRun) benchNoShows(r *roundRun) {
	for _, d := range r.cohort.ReportedDevices() {
		delete(t.noShows, d)
	}
	if !r.waitedOut {
		return
	}
	for _, d := range r.cohort.Silent() {
		if t.noShows == nil {
			t.noShows = map[string]round.NoShow{}
		}
		ns := t.noShows[d].Strike(r.row.Round)
		t.noShows[d] = ns
		t.log().Info("device held a seat in silence; it sits rounds out", "round", r.row.Round, "device", d,
			"strikes", ns.Strikes, "until_round", ns.Until)
	}
}
