package aggregator

import (
	"encoding/binary"
	"fmt"
	"math"
)

// State encoding, version 1, little-endian:
//
//	[0]      version (1)
//	[1]      kind
//	[2:10]   dim, uint64
//	[10:18]  steps, uint64
//	[18:]    the rule's state vectors, dim float32 each: none for FedAvg,
//	         Median and TrimmedMean; momentum for FedAvgM; first then second
//	         moment for FedAdam, FedYogi and FedAdagrad.
//
// The hyperparameters are not stored: they belong to the task's
// configuration, and the rule they restore into carries them.
const (
	stateVersion = 1
	stateHeader  = 18
)

func (r *rule) MarshalBinary() ([]byte, error) {
	b := make([]byte, stateHeader, stateHeader+4*r.dim*r.kind.vectors())
	b[0] = stateVersion
	b[1] = byte(r.kind)
	binary.LittleEndian.PutUint64(b[2:], uint64(r.dim))
	binary.LittleEndian.PutUint64(b[10:], r.steps)
	for _, vec := range [][]float32{r.m, r.v} {
		for _, x := range vec {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
		}
	}
	return b, nil
}

func (r *rule) UnmarshalBinary(b []byte) error {
	if len(b) < stateHeader {
		return fmt.Errorf("aggregator: state: %d bytes, shorter than the %d-byte header: %w", len(b), stateHeader, ErrState)
	}
	if b[0] != stateVersion {
		return fmt.Errorf("aggregator: state: version %d, want %d: %w", b[0], stateVersion, ErrState)
	}
	if k := Kind(b[1]); k != r.kind {
		return fmt.Errorf("aggregator: state: for rule %v, not %v: %w", k, r.kind, ErrState)
	}
	if dim := binary.LittleEndian.Uint64(b[2:]); dim != uint64(r.dim) {
		return fmt.Errorf("aggregator: state: dimension %d, want %d: %w", dim, r.dim, ErrState)
	}
	nvec := r.kind.vectors()
	if want := stateHeader + 4*r.dim*nvec; len(b) != want {
		return fmt.Errorf("aggregator: state: %d bytes, want %d: %w", len(b), want, ErrState)
	}
	steps := binary.LittleEndian.Uint64(b[10:])
	vecs := make([][]float32, nvec)
	p := b[stateHeader:]
	for j := range vecs {
		vec := make([]float32, r.dim)
		for i := range vec {
			x := math.Float32frombits(binary.LittleEndian.Uint32(p))
			p = p[4:]
			if !finite32(x) {
				return fmt.Errorf("aggregator: state: vector %d [%d] = %v is not finite: %w", j, i, x, ErrState)
			}
			// A negative second moment would make √v NaN.
			if j == 1 && x < 0 {
				return fmt.Errorf("aggregator: state: second moment [%d] = %v is negative: %w", i, x, ErrState)
			}
			vec[i] = x
		}
		vecs[j] = vec
	}
	r.steps = steps
	if nvec > 0 {
		r.m = vecs[0]
	}
	if nvec > 1 {
		r.v = vecs[1]
	}
	return nil
}
