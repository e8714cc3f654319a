package coord

import (
	"context"
	"fmt"
	"math"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/privacyconf"
)

// Adaptive clipping in rounds (docs/DP.md, "Adaptive clipping"; Andrew,
// Thakkar, McMahan, Ramaswamy 2021). Each device of a training round tells
// whether its update was within the round's clip bound C: in its signed
// report in a plaintext round, as one more element of the secure sum in a
// secure round, noised by the devices themselves under distributed DP. The
// server noises the count once under central DP (σ_b), divides it by the
// round's updates to get b̄, and at the commit moves the bound to
// C·exp(−η·(b̄ − γ)) for the next training round. The bound is stored with
// the commit (RoundRow.ClipNorm), so a restarted or failed-over server
// plans the next round with it, and the round's dp.spent audit event
// records C, b̄ and the next bound.

// clipStep is a committed training round's adaptive clipping step: the
// noised fraction of its updates within the bound, and the next bound.
// Zero without adaptive clipping.
type clipStep struct{ fraction, next float64 }

// adaptive reports whether the task clips adaptively.
func (t *taskRun) adaptive() bool { return t.dp != nil && privacyconf.Adaptive(t.dp.cfg) }

// loadClip reads the bound the task's last committed training round set.
func (t *taskRun) loadClip(ctx context.Context) error {
	if !t.adaptive() {
		return nil
	}
	c, err := t.c.d.Store.ClipNorm(ctx, t.id)
	if err != nil {
		return err
	}
	if c > 0 {
		t.dp.clip = c
	}
	return nil
}

// noteClipBit keeps the bit of an accepted plaintext report of device; a
// report read again overwrites its own.
func (r *roundRun) noteClipBit(device string, bit pb.ClipBit) {
	if bit == pb.ClipBit_CLIP_BIT_UNSPECIFIED {
		return
	}
	if r.clipBits == nil {
		r.clipBits = map[string]bool{}
	}
	r.clipBits[device] = bit == pb.ClipBit_CLIP_BIT_UNCLIPPED
}

// noteClipCount keeps a secure round's decoded count of unclipped updates.
func (r *roundRun) noteClipCount(count float64) { r.clipCount, r.clipCounted = count, true }

// clipStep is the adaptive clipping step of round r, whose sum holds the
// updates of participants.
func (t *taskRun) clipStep(r *roundRun, participants []string) (clipStep, error) {
	if !t.adaptive() || r.row.Kind != pb.RoundKind_ROUND_KIND_TRAIN {
		return clipStep{}, nil
	}
	m := len(participants)
	if m == 0 {
		return clipStep{}, fmt.Errorf("adaptive clipping: no updates")
	}
	count := r.clipCount
	if !r.clipCounted {
		if r.secure != nil {
			return clipStep{}, fmt.Errorf("adaptive clipping: the secure sum carried no count")
		}
		count = 0
		for _, d := range participants {
			bit, ok := r.clipBits[d]
			if !ok {
				return clipStep{}, fmt.Errorf("adaptive clipping: no bit of %s", d)
			}
			if bit {
				count++
			}
		}
	}
	if t.dp.dist == nil {
		// Central DP: the server noises the count; distributed DP's count
		// arrived noised by the devices.
		count += t.dp.cfg.GetClipCountStddev() * t.dp.src.Normal()
	}
	b := count / float64(m)
	// The step uses b̄ clamped to [0, 1] (post-processing of the release),
	// so that a noise spike in a small round moves the bound by at most
	// e^η; the audit log records b̄ itself.
	next := t.dp.clip * math.Exp(-t.dp.cfg.GetClipLearningRate()*(min(max(b, 0), 1)-t.dp.cfg.GetTargetUnclippedQuantile()))
	if !(next > 0) || math.IsInf(next, 0) {
		return clipStep{}, fmt.Errorf("adaptive clipping: bound %v after %v", next, t.dp.clip)
	}
	return clipStep{fraction: b, next: next}, nil
}

// committedClip takes a committed round's next bound as the task's.
func (t *taskRun) committedClip(next float64) {
	if t.adaptive() && next > 0 {
		t.dp.clip = next
	}
}
