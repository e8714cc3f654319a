package round

import "fmt"

// Influence is what bounds one device's influence on a round's sum.
type Influence struct {
	// MaxUpdateNorm bounds an update's L2 norm (0: no bound); the task's
	// robustness settings resolve it, with a default for a task that sets
	// none.
	MaxUpdateNorm float64
	// MaxExamples caps the example count a report's weight counts.
	MaxExamples uint64
	// DP is set for a task with differential privacy: devices clip their
	// updates to ClipNorm, and every report weighs the same.
	DP       bool
	ClipNorm float64
	// LocalDP: devices add their own noise, which makes updates longer
	// than the clip norm.
	LocalDP bool
}

// NormBound is the bound CheckNorm applies to a plaintext update.
func (i Influence) NormBound() float64 {
	switch {
	case !i.DP:
		return i.MaxUpdateNorm
	case i.LocalDP:
		return 0
	}
	// Devices clip to C; the slack covers their float32 rounding.
	return i.ClipNorm * (1 + 1e-5)
}

// Weight is how much a report of examples examples counts in the average:
// its example count up to MaxExamples, or 1 under differential privacy,
// where the clip norm bounds every device's influence only if weights do
// not scale it.
func (i Influence) Weight(examples uint64) float64 {
	if i.DP {
		return 1
	}
	return float64(min(examples, i.MaxExamples))
}

// MaxFailureBytes bounds a device's report that it could not carry out its
// plan: ids and a short reason.
const MaxFailureBytes = 2 << 10

// Failure is a device's report that it could not carry out its plan, with
// the round and device its subject names.
type Failure struct {
	Size                      int // bytes
	SubjectTask, BodyTask     string
	SubjectRound, BodyRound   uint64
	SubjectDevice, BodyDevice string
}

// CheckFailure says why a failure report is turned away before it reaches
// the round (Cohort.Fail decides the rest), or "" when it is not: its size,
// and a body that names another task, round or device than its subject,
// which only that device may publish on.
func CheckFailure(f Failure) string {
	switch {
	case f.Size > MaxFailureBytes:
		return fmt.Sprintf("failure report of %d bytes exceeds %d", f.Size, MaxFailureBytes)
	case f.BodyTask != f.SubjectTask || f.BodyRound != f.SubjectRound || f.BodyDevice != f.SubjectDevice:
		return fmt.Sprintf("failure report names %s/%d/%s, subject %s/%d/%s", f.BodyTask, f.BodyRound, f.BodyDevice,
			f.SubjectTask, f.SubjectRound, f.SubjectDevice)
	}
	return ""
}
