package round

import "fmt"

// Plain is what a plaintext round's close depends on.
type Plain struct {
	CohortTarget int // reports that close the round at once (0: none)
	ReportGoal   int // the fewest reports a round commits with
	Assigned     int // devices seated
	Reported     int // reports counted
	// Settled counts the seated devices that reported, failed or had their
	// report refused: none of them holds the round any longer.
	Settled   int
	Selecting bool // selection is still open
	// DeadlinePassed: the report deadline has come.
	DeadlinePassed bool
}

// Outcome is a close decision.
type Outcome int

// The outcomes.
const (
	Wait    Outcome = iota // the round stays open
	Commit                 // the round closes and commits
	Abandon                // the round closes without a model
)

// Decide says whether the round closes now, how, and why.
//
// It closes when its cohort target of reports is in; when every seated
// device has settled (reported, failed or been refused) after selection
// closed, provided the reports reach the goal (below it the round waits: a
// refused device may still send a valid report in time, and closing could
// only abandon); or at the report deadline. Closing below the report goal
// abandons; short says the round lacked devices rather than reports.
func (p Plain) Decide() (o Outcome, reason string, short bool) {
	everyone := !p.Selecting && p.Settled == p.Assigned
	switch {
	case p.DeadlinePassed:
		reason = "report deadline passed"
	case p.CohortTarget > 0 && p.Reported >= p.CohortTarget:
		reason = fmt.Sprintf("cohort target %d reached", p.CohortTarget)
	case everyone && p.Reported > 0 && p.Reported >= p.ReportGoal:
		reason = "every selected device reported"
		if p.Reported < p.Assigned {
			reason = "every selected device reported or failed"
		}
	default:
		return Wait, "", false
	}
	if p.Reported < p.ReportGoal || p.Reported == 0 {
		// A round resumed past both its timers may see the deadline first:
		// a cohort below the goal is still a want of devices, not of reports.
		return Abandon, fmt.Sprintf("%s with %d reports, below the report goal %d", reason, p.Reported, p.ReportGoal),
			p.Assigned < p.ReportGoal
	}
	return Commit, reason, false
}
