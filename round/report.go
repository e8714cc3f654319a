package round

import (
	"crypto/ed25519"
	"slices"

	"github.com/fleetlearn/fleetlearn/aggregator"
	"github.com/fleetlearn/fleetlearn/privacy/secagg"
)

// Form is how an update report carries its values.
type Form int

// The forms.
const (
	FormNone      Form = iota // no payload
	FormDense                 // float32 values
	FormQuantized             // int8 or int4 codes with block scales
	FormMasked                // a secure round's masked values
)

// CheckForm decides whether a plaintext round of a task whose updates
// travel in bits bits (0: float32, 8 or 4: quantized) takes a payload of
// form f.
func CheckForm(task string, round uint64, bits int, f Form) error {
	switch {
	case f == FormDense && bits == 0, f == FormQuantized && (bits == 8 || bits == 4):
		return nil
	case f == FormDense:
		return refuse(ClassPayload, "update is float32, task %s takes %s updates", task, EncodingName(bits))
	case f == FormQuantized && bits == 0:
		return refuse(ClassPayload, "update is quantized, task %s takes float32 updates", task)
	case f == FormQuantized:
		return refuse(ClassPayload, "update encoding %s is unknown", EncodingName(bits))
	case f == FormMasked:
		return refuse(ClassPayload, "update has no dense payload (a masked one, but round %d is not secure)", round)
	}
	return refuse(ClassPayload, "update has no dense payload")
}

// CheckQuantized decides whether a quantized payload declaring sent bits
// per code is what a task of bits bits takes (the form said quantized; the
// payload says how).
func CheckQuantized(task string, bits, sent int) error {
	if sent != bits {
		return refuse(ClassPayload, "update is %s-quantized, task %s takes %s updates", EncodingName(sent), task, EncodingName(bits))
	}
	return nil
}

// CheckDigest decides whether the payload's sha256 (got) is the one the
// report declared, and signed.
func CheckDigest(got, declared string) error {
	if got != declared {
		return refuse(ClassPayload, "payload sha256 %s does not match the declared %q", got, declared)
	}
	return nil
}

// Tensor is one entry of an update's layout.
type Tensor struct {
	Name  string
	Shape []uint64
}

// CheckLayout decides whether an update's layout (got) is exactly the
// tensors the task trains (want), in order: a device cannot touch a frozen
// tensor (LoRA's base weights) or reshape a trained one.
func CheckLayout(want, got []Tensor) error {
	if len(got) != len(want) {
		return refuse(ClassPayload, "update has %d tensors, the task trains %d", len(got), len(want))
	}
	for i, e := range want {
		s := got[i]
		if s.Name != e.Name || len(s.Shape) != len(e.Shape) {
			return refuse(ClassPayload, "tensor %d is %s%v, the task trains %s%v", i, s.Name, s.Shape, e.Name, e.Shape)
		}
		if !slices.Equal(s.Shape, e.Shape) {
			return refuse(ClassPayload, "tensor %s has shape %v, model has %v", e.Name, s.Shape, e.Shape)
		}
	}
	return nil
}

// Signed is a report's signature and who it should be from.
type Signed struct {
	Device string
	KeyID  string // the key the report names
	Sig    []byte
	// Key is the key the device enrolled; nil for a device not enrolled.
	Key ed25519.PublicKey
	// RequireEnrollment: the server takes reports from enrolled devices only.
	RequireEnrollment bool
}

// CheckSignature decides whether a report is signed as it must be: by the
// key its device enrolled, verify checking the signature over the report's
// statement (identity.VerifyReport). A device not enrolled is taken, unsigned,
// only where the server does not require enrollment.
func CheckSignature(s Signed, verify func(key ed25519.PublicKey, sig []byte) error) error {
	if s.Key == nil {
		if s.RequireEnrollment {
			return refuse(ClassSignature, "device %q is not enrolled", s.Device)
		}
		return nil
	}
	if len(s.Sig) == 0 {
		return refuse(ClassSignature, "report is not signed")
	}
	if err := verify(s.Key, s.Sig); err != nil {
		return refuse(ClassSignature, "signature does not verify with the key device %q enrolled (report names key %q): %v", s.Device, s.KeyID, err)
	}
	return nil
}

// CheckNorm decides whether an update of L2 norm norm is within the task's
// bound (0: none), with aggregator.NormTolerance for the rounding of norms
// computed in another order.
func CheckNorm(norm, bound float64) error {
	if bound > 0 && !(norm <= bound*(1+aggregator.NormTolerance)) {
		return refuse(ClassAggregate, "update norm %.6g exceeds bound %.6g", norm, bound)
	}
	return nil
}

// Masked is what a secure round checks of a masked report before its
// values.
type Masked struct {
	Present     bool   // the report carries a masked payload
	Examples    uint64 // its plaintext example count
	Metrics     int    // its plaintext metrics
	Participant uint32 // the participant it says it is
	Bits        int    // the ring it says its values are in
}

// CheckMaskedStage decides whether a secure round in stage takes masked
// input at all; checked before the report is read.
func CheckMaskedStage(stage secagg.Stage) error {
	if stage != secagg.StageMaskedInput {
		return refuse(ClassSecAgg, "masked input arrived in the %v stage", stage)
	}
	return nil
}

// CheckMasked decides whether a secure round takes a masked report from the
// device holding seat, in a round whose ring has bits bits: in the
// masked-input stage only, masked, with the weight and metrics inside the
// masked vector (a plaintext count or metric would reveal what secure
// aggregation hides), for the device's own participant id, in the round's
// ring.
func CheckMasked(m Masked, seat Seat, bits int) error {
	switch {
	case !m.Present:
		return refuse(ClassSecAgg, "a secure round takes masked updates only")
	case m.Examples != 0:
		return refuse(ClassSecAgg, "num_examples must be 0 in a masked report (the weight is masked)")
	case m.Metrics > 0:
		return refuse(ClassSecAgg, "a masked report carries no plaintext metrics")
	case m.Participant != seat.Participant:
		return refuse(ClassSecAgg, "masked update for participant %d from participant %d", m.Participant, seat.Participant)
	case m.Bits != bits:
		return refuse(ClassSecAgg, "masked values in a %d-bit ring, the round's ring has %d bits", m.Bits, bits)
	}
	return nil
}
