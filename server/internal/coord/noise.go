package coord

import (
	"context"
	crand "crypto/rand"
	"encoding/json"
	"fmt"
	"io"

	"github.com/fleetlearn/fleetlearn/privacy/dp"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/privacyconf"
)

// Correlated central noise (docs/DP.md, "Correlated noise"). A task with
// tree or BLT noise adds to each committed training round's sum the
// round's term of a noise stream laid out over the task's rounds. The
// stream's Gaussians derive from a secret of the task's, kept in the store
// (Store.DPSecret: the first replica's wins), and its state after each
// committed training round is stored with that round's commit
// (RoundRow.NoiseState), so a restarted or failed-over server continues the
// same stream, bit for bit. The state holds the fitted BLT's parameters
// too: a refit elsewhere (another machine's floating point) cannot change
// the stream in the middle.

// noiseEnvelope is the stored state of a task's noise stream.
type noiseEnvelope struct {
	Noise string    `json:"noise"` // "tree" or "blt"
	Theta []float64 `json:"theta,omitempty"`
	Omega []float64 `json:"omega,omitempty"`
	State []byte    `json:"state"` // the generator's MarshalBinary
}

// noiseStream is a tree or BLT noise generator.
type noiseStream interface {
	Next(dst []float64) error
	MarshalBinary() ([]byte, error)
	UnmarshalBinary([]byte) error
}

// secretSize is the bytes of a task's noise secret.
const secretSize = 32

// loadNoise reads, for a task with correlated noise, its secret (making
// one on the task's first load) and its noise stream's state.
func (t *taskRun) loadNoise(ctx context.Context) error {
	if t.dp == nil || t.dp.acct.Correlated == nil {
		return nil
	}
	r := t.c.d.SecretReader
	if r == nil {
		r = crand.Reader
	}
	fresh := make([]byte, secretSize)
	if _, err := io.ReadFull(r, fresh); err != nil {
		return fmt.Errorf("dp noise secret: %w", err)
	}
	secret, err := t.c.d.Store.DPSecret(ctx, t.id, fresh)
	if err != nil {
		return err
	}
	if len(secret) != secretSize {
		return fmt.Errorf("dp noise secret of %d bytes in the store, want %d", len(secret), secretSize)
	}
	state, err := t.c.d.Store.NoiseState(ctx, t.id)
	if err != nil {
		return err
	}
	t.dp.secret, t.dp.noiseState = secret, state
	// The BLT's buffers: a model's worth of float64 each.
	if c := t.dp.acct.Correlated; c.Noise == pb.DPNoise_DP_NOISE_BLT {
		t.hold("noise", 8*int64(t.ulayout.Size())*int64(len(c.BLT.Theta)))
	}
	return nil
}

// noiseStream rebuilds the task's noise stream as it stood after the last
// committed training round, with the envelope that names it (its state
// left for the caller to fill in).
func (t *taskRun) noiseStream() (noiseStream, noiseEnvelope, error) {
	c := t.dp.acct.Correlated
	dim, std := t.ulayout.Size(), t.dp.cfg.GetNoiseMultiplier()*t.dp.cfg.GetClipNorm()
	if t.adaptive() {
		// The bound changes from round to round: the stream is of unit
		// Gaussians, each round's term scaled by its own z_Δ·C
		// (addCorrelatedNoise), as the mechanism over updates divided by
		// their round's bound is.
		std = 1
	}
	var env noiseEnvelope
	if t.dp.noiseState != nil {
		if err := json.Unmarshal(t.dp.noiseState, &env); err != nil {
			return nil, env, fmt.Errorf("stored noise state: %w", err)
		}
	}
	stored := env.State
	var s noiseStream
	var err error
	switch c.Noise {
	case pb.DPNoise_DP_NOISE_TREE:
		if env.Noise != "" && env.Noise != "tree" {
			return nil, env, fmt.Errorf("stored noise state is %q, the task's noise tree", env.Noise)
		}
		env = noiseEnvelope{Noise: "tree"}
		s, err = dp.NewTreeNoise(t.dp.secret, dim, std, 0)
	case pb.DPNoise_DP_NOISE_BLT:
		if env.Noise == "" {
			env = noiseEnvelope{Noise: "blt", Theta: c.BLT.Theta, Omega: c.BLT.Omega}
		} else if env.Noise != "blt" {
			return nil, env, fmt.Errorf("stored noise state is %q, the task's noise blt", env.Noise)
		}
		env.State = nil
		s, err = dp.NewBLTNoise(dp.BLT{Theta: env.Theta, Omega: env.Omega}, t.dp.secret, dim, std)
	default:
		return nil, env, fmt.Errorf("noise %v is not correlated", c.Noise)
	}
	if err != nil {
		return nil, env, err
	}
	if stored != nil {
		if err := s.UnmarshalBinary(stored); err != nil {
			return nil, env, fmt.Errorf("stored noise state: %w", err)
		}
	}
	return s, env, nil
}

// addCorrelatedNoise adds the next term of the task's noise stream, over
// the total weight, to a round's mean update and returns the stream's
// state after it. Nothing in memory changes until the round commits
// (committedNoise): a round that does not commit leaves the stream where
// it was.
func (t *taskRun) addCorrelatedNoise(mean []float32, totalWeight float64) ([]byte, error) {
	s, env, err := t.noiseStream()
	if err != nil {
		return nil, err
	}
	noise := make([]float64, len(mean))
	if err := s.Next(noise); err != nil {
		return nil, err
	}
	scale := 1.0
	if t.adaptive() {
		scale = privacyconf.UpdateNoiseMultiplier(t.dp.cfg) * t.dp.clip
	}
	for i, v := range noise {
		mean[i] += float32(v * scale / totalWeight)
	}
	if env.State, err = s.MarshalBinary(); err != nil {
		return nil, err
	}
	return json.Marshal(env)
}

// committedNoise takes a committed round's noise state as the task's.
func (t *taskRun) committedNoise(state []byte) {
	if t.dp != nil && state != nil {
		t.dp.noiseState = state
	}
}
