package round

import (
	"time"

	"github.com/fleetlearn/fleetlearn/privacy/secagg"
)

// Secure stage timing. A SecAgg stage waits for the devices it expects. A
// fixed timer per stage lost whole rounds as cohorts grew: a cohort of
// hundreds takes longer than any fixed timer to download the model and
// advertise, or to compute and exchange its shares, and a stage closed
// while answers were still arriving left too few of them for the
// threshold. So a stage closes when
//
//  1. everyone it expects has answered; or
//  2. it has gone quiet: no answer for max(stage_timeout, half the time its
//     answers so far took), and closing now keeps the round alive (every
//     safety check of the close passes and enough devices remain for the
//     report goal); a stage whose close would lose the round waits on,
//     since waiting can only help it; or
//  3. its cap comes, a share of the time left before the round's report
//     deadline (StageCap), whatever it has then.
//
// The quiet period grows with the stage's own progress, which grows with
// the cohort: answers that took 20 s to arrive are not given up on after
// 2 s of silence. Only accepted answers are progress, and each device has
// one per stage, so no device can hold a stage open past its cap.

// StageTiming is what the close rule knows of the current stage.
type StageTiming struct {
	// Start is when the stage began waiting: when selection ended for the
	// advertisement stage (devices advertise as they take their seats), when
	// the previous stage closed for the others.
	Start time.Time
	// Last is when the latest answer was accepted; zero if none yet.
	Last               time.Time
	Answered, Expected int
	// MinQuiet is the task's stage timeout: the shortest silence after
	// which a stage counts as quiet.
	MinQuiet time.Duration
	// Cap is when the stage closes whatever it has (StageCap).
	Cap time.Time
}

// QuietEnd is when the stage has gone quiet if no further answer comes.
func (s StageTiming) QuietEnd() time.Time {
	ref := s.Start
	if s.Last.After(ref) {
		ref = s.Last
	}
	return ref.Add(max(s.MinQuiet, ref.Sub(s.Start)/2))
}

// Decide says whether the stage closes at now and, if it does not, when to
// decide again (absent new answers). viable reports whether closing now
// keeps the round alive; it is asked only of a stage that has gone quiet
// before its cap.
func (s StageTiming) Decide(now time.Time, viable func() bool) (closeNow bool, wake time.Time) {
	if s.Expected > 0 && s.Answered >= s.Expected || !now.Before(s.Cap) {
		return true, time.Time{}
	}
	if q := s.QuietEnd(); now.Before(q) {
		return false, minTime(q, s.Cap)
	}
	if viable() {
		return true, time.Time{}
	}
	return false, s.Cap
}

// StageCap is the latest a stage begun at start may close, given the
// round's report deadline, after which devices stop working on it. The
// masked input closes at the deadline less two stage timeouts, as the
// plan's deadline provides (plan.go), leaving those two to consistency and
// unmasking; the key stages before it may take a quarter and a third of
// the time left to the masked input's cap (training happens in the masked
// input stage and needs most of it), consistency half of what is left to
// the deadline, unmasking the rest. Each stage but the masked input gets
// at least one stage timeout.
func StageCap(stage secagg.Stage, start, deadline time.Time, stageTimeout time.Duration) time.Time {
	maskedEnd := deadline.Add(-2 * stageTimeout)
	part := func(end time.Time, num, den time.Duration) time.Time {
		return start.Add(max(stageTimeout, end.Sub(start)*num/den))
	}
	switch stage {
	case secagg.StageAdvertise:
		return part(maskedEnd, 1, 4)
	case secagg.StageShareKeys:
		return part(maskedEnd, 1, 3)
	case secagg.StageMaskedInput:
		return maskedEnd
	case secagg.StageConsistency:
		return part(deadline, 1, 2)
	default:
		return part(deadline, 1, 1)
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// Stages is a secure round's stage clock: when the current stage began
// waiting, how many answers it has and when the latest came. It decides
// each stage's close by the rule above; the caller runs the stages
// (secagg.Server) and arms one timer at the wake time it is given.
type Stages struct {
	// MinQuiet is the task's stage timeout; Deadline the round's report
	// deadline.
	MinQuiet time.Duration
	Deadline time.Time

	began, last time.Time
	seen        int
}

// Begun reports whether the current stage has begun waiting: the
// advertisement stage begins when selection ends.
func (s *Stages) Begun() bool { return !s.began.IsZero() }

// Begin starts the current stage's wait at now: at the end of selection
// for the advertisement stage, at the previous stage's close for the others.
func (s *Stages) Begin(now time.Time) { s.began, s.last, s.seen = now, time.Time{}, 0 }

// StageDecision is what Stages.Decide says of the current stage.
type StageDecision struct {
	Close bool // close the stage now
	// WaitedOut: it closes with devices it expected silent, which then
	// count as no-shows (NoShow).
	WaitedOut bool
	// Wake is when to decide again if no answer comes, for a stage that
	// stays open.
	Wake time.Time
}

// Decide says whether stage, which has answered of expected answers at now,
// closes; viable reports whether closing keeps the round alive.
func (s *Stages) Decide(now time.Time, stage secagg.Stage, answered, expected int, viable func() bool) StageDecision {
	if answered > s.seen {
		s.seen, s.last = answered, now
	}
	st := StageTiming{Start: s.began, Last: s.last, Answered: answered, Expected: expected,
		MinQuiet: s.MinQuiet, Cap: StageCap(stage, s.began, s.Deadline, s.MinQuiet)}
	closeNow, wake := st.Decide(now, viable)
	if !closeNow {
		return StageDecision{Wake: wake}
	}
	return StageDecision{Close: true, WaitedOut: answered < expected}
}
