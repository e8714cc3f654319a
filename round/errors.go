package round

import (
	"errors"
	"fmt"
)

// ErrRefused marks every refusal: errors.Is(err, ErrRefused) tells a
// refused report from the server's own trouble.
var ErrRefused = errors.New("report refused")

// Class is why a report was refused, as the service counts refusals.
type Class string

// The refusal classes.
const (
	ClassSubject   Class = "subject"   // the subject is malformed or names another round
	ClassCohort    Class = "cohort"    // the device is not in the round's cohort
	ClassDuplicate Class = "duplicate" // the device already reported
	ClassQuota     Class = "quota"     // the device stored more than the round admits per device
	ClassKind      Class = "kind"      // an update where an evaluation is wanted, or the reverse
	ClassHeader    Class = "header"    // the body names another task, round, device, model or module
	ClassMetrics   Class = "metrics"   // too many, badly named or out-of-range metrics
	ClassExamples  Class = "examples"  // num_examples outside what the device declared
	ClassSignature Class = "signature" // unsigned, not enrolled, or the signature does not verify
	ClassPayload   Class = "payload"   // encoding, digest, layout or shape of the update is wrong
	ClassAggregate Class = "aggregate" // the update is outside the task's bounds (its norm)
	ClassSecAgg    Class = "secagg"    // a masked report that breaks the secure round's rules
	ClassStale     Class = "stale"     // an async report trained on a version too far behind the current
)

// Refusal is a refused report: its class and what the device is told.
type Refusal struct {
	Class Class
	msg   string
}

func (r *Refusal) Error() string { return ErrRefused.Error() + ": " + r.msg }
func (r *Refusal) Unwrap() error { return ErrRefused }

// Reason is the message without the "report refused" prefix.
func (r *Refusal) Reason() string { return r.msg }

func refuse(c Class, format string, args ...any) error {
	return &Refusal{Class: c, msg: fmt.Sprintf(format, args...)}
}
