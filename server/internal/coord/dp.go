package coord

import (
	"context"
	crand "crypto/rand"
	"fmt"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/privacy/dp"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/privacyconf"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/round"
)

// dpRun is a task's differential privacy: the resolved settings, how its
// rounds are accounted, and the noise source for central noise.
type dpRun struct {
	cfg  *pb.DPConfig // defaults filled in; what plans carry
	q    float64      // sampling rate the accountant assumes (1: no amplification)
	dist *dp.Distributed
	src  *dp.Source
	acct *privacyconf.Accounting
	// secret and noiseState are correlated noise's (noise.go): the secret
	// its Gaussians derive from and the stream's state after the last
	// committed training round (nil before the first).
	secret, noiseState []byte
	// clip is the clip bound of the task's open or next training round:
	// dp.clip_norm, or with adaptive clipping the bound the last committed
	// training round set (clip.go).
	clip float64

	// eps holds the accountant's recent answers by round count: a round's
	// budget check at open asks for ε after n and n+1 rounds and its commit
	// asks for both again, each answer an accountant run (the PLD
	// accountant's take tens of milliseconds).
	mu  sync.Mutex
	eps map[int]float64
}

// ResolveDP fills in a task's DP defaults (privacyconf.ResolveDP); nil for
// tasks without DP.
func ResolveDP(task *pb.Task) *pb.DPConfig { return privacyconf.ResolveDP(task) }

// CheckDP validates a task's DP settings for a model of dim parameters; it
// is what task creation runs, so a running task never meets bad settings.
func CheckDP(task *pb.Task, dim int) error {
	_, err := newDPRun(task, dim)
	return err
}

// newDPRun returns the DP of a task whose updates have dim elements; nil
// for a task without DP. The rules are privacyconf's, which the CLI applies
// too.
func newDPRun(task *pb.Task, dim int) (*dpRun, error) {
	if ResolveDP(task) == nil {
		return nil, nil
	}
	if dim < 1 {
		// NewAccounting would take 0 for a size it may not check against.
		return nil, fmt.Errorf("dp: an update of %d elements", dim)
	}
	acct, err := privacyconf.NewAccounting(task, dim, privacyconf.APINames)
	if err != nil || acct == nil {
		return nil, err
	}
	src, err := dp.NewSource(crand.Reader)
	if err != nil {
		return nil, err
	}
	return &dpRun{cfg: acct.Config, q: acct.Q, dist: acct.Distributed, src: src, acct: acct, clip: acct.Config.GetClipNorm()}, nil
}

// epsilonAfter is the task's ε at its δ after rounds committed training rounds.
func (d *dpRun) epsilonAfter(rounds int) (float64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if e, ok := d.eps[rounds]; ok {
		return e, nil
	}
	e, err := d.acct.EpsilonAfter(rounds)
	if err != nil {
		return 0, err
	}
	if d.eps == nil {
		d.eps = map[int]float64{}
	}
	// Rounds only move forward: answers for two rounds back are not asked again.
	for n := range d.eps {
		if n < rounds-1 {
			delete(d.eps, n)
		}
	}
	d.eps[rounds] = e
	return e, nil
}

// roundConfig is the DP settings the open or next training round runs
// and its plans carry: the task's, at the round's clip bound.
func (d *dpRun) roundConfig() *pb.DPConfig {
	if d.clip == d.cfg.GetClipNorm() {
		return d.cfg
	}
	c := proto.CloneOf(d.cfg)
	c.ClipNorm = d.clip
	return c
}

// maxRounds is the per-device participation cap; 0 without DP or cap.
func (d *dpRun) maxRounds() int {
	if d == nil {
		return 0
	}
	return int(d.cfg.GetMaxRoundsPerDevice())
}

// minSeparation is the fewest training steps between two a device takes
// part in; 0 without DP or separation.
func (d *dpRun) minSeparation() int {
	if d == nil {
		return 0
	}
	return int(d.cfg.GetMinSeparation())
}

// limitsParticipation reports whether the task caps or spaces out each
// device's rounds, so that its participations are read at each round.
func (d *dpRun) limitsParticipation() bool { return d.maxRounds() > 0 || d.minSeparation() > 0 }

// mechanismName is the mechanism as the audit log names it.
func (d *dpRun) mechanismName() string {
	switch d.cfg.GetMechanism() {
	case pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN:
		return "central-gaussian"
	case pb.DPMechanism_DP_MECHANISM_LOCAL:
		return "local-gaussian"
	case pb.DPMechanism_DP_MECHANISM_DISTRIBUTED_DISCRETE_GAUSSIAN:
		return "distributed-discrete-gaussian"
	case pb.DPMechanism_DP_MECHANISM_SKELLAM:
		return "distributed-skellam"
	}
	return d.cfg.GetMechanism().String()
}

// checkBudget refuses the next training round if it would take the task past
// its ε target: the refusal is recorded and the task stops. done reports
// that the task stopped.
func (t *taskRun) checkBudget(ctx context.Context, trainRounds uint32, nextRound uint64) (done bool, err error) {
	if t.dp == nil {
		return false, nil
	}
	spent, err := t.dp.epsilonAfter(int(trainRounds))
	if err != nil {
		return false, err
	}
	next, err := t.dp.epsilonAfter(int(trainRounds) + 1)
	if err != nil {
		return false, err
	}
	target := t.dp.cfg.GetTargetEpsilon()
	if next <= target {
		return false, nil
	}
	reason := fmt.Sprintf("privacy budget: round %d would bring epsilon to %.4g, past the target %.4g at delta %g (spent %.4g in %d rounds)",
		nextRound, next, target, t.dp.cfg.GetDelta(), spent, trainRounds)
	t.log().Warn("round refused", "reason", reason)
	if err := t.c.record(audit.BudgetRefused{Task: t.id, Round: nextRound, CumulativeEpsilon: spent, RequestedEpsilon: next,
		EpsilonBudget: target, Delta: t.dp.cfg.GetDelta(), Reason: reason}); err != nil {
		return false, fmt.Errorf("budget refusal: audit: %w", err)
	}
	if err := t.c.d.Store.SetTaskState(ctx, t.id, pb.TaskState_TASK_STATE_STOPPED, reason, t.c.now()); err != nil {
		return false, err
	}
	t.recordStopped(ctx, audit.TaskStoppedBy, reason)
	return true, nil
}

// addCentralNoise adds the central mechanism's noise to a round's mean
// update (no-op for other mechanisms). The mechanism is noise N(0, (zC)²)
// on the sum of clipped updates; the mean is that sum over the total weight
// (the count, since DP weighs every update 1), so its noise is zC/W. C is
// the round's clip bound and z the update's multiplier (with adaptive
// clipping less than the task's; privacyconf.UpdateNoiseMultiplier). With
// correlated noise it returns the noise stream's state after the round,
// for the commit to store.
func (t *taskRun) addCentralNoise(mean []float32, totalWeight float64) (noiseState []byte, err error) {
	if t.dp == nil || t.dp.cfg.GetMechanism() != pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN {
		return nil, nil
	}
	if !(totalWeight > 0) {
		return nil, fmt.Errorf("total weight %v", totalWeight)
	}
	if t.dp.acct.Correlated != nil {
		return t.addCorrelatedNoise(mean, totalWeight)
	}
	// The source draws one normal per element in order, so a block at a
	// time draws the noise a whole vector would, without a second model.
	noise := make([]float64, min(len(mean), 1<<14))
	for off := 0; off < len(mean); off += len(noise) {
		block := noise[:min(len(noise), len(mean)-off)]
		clear(block)
		if err := dp.AddCentralNoise(block, t.dp.clip, privacyconf.UpdateNoiseMultiplier(t.dp.cfg), t.dp.src); err != nil {
			return nil, err
		}
		for i, v := range block {
			mean[off+i] += float32(v / totalWeight)
		}
	}
	return nil, nil
}

// spentEvent is a committed training round's privacy cost, for the audit log.
// noiseState is the correlated noise stream's state after the round (nil
// for independent noise).
func (t *taskRun) spentEvent(round uint64, before, after float64, noiseState []byte, clip clipStep) audit.PrivacySpent {
	ev := audit.PrivacySpent{Task: t.id, Round: round, Mechanism: t.dp.mechanismName(),
		Accountant: t.accountantName(), ClipNorm: t.dp.clip, NoiseMultiplier: t.dp.cfg.GetNoiseMultiplier(),
		SamplingRate: t.dp.q, Delta: t.dp.cfg.GetDelta(), Epsilon: after - before, CumulativeEpsilon: after,
		EpsilonBudget: t.dp.cfg.GetTargetEpsilon()}
	if c := t.dp.acct.Correlated; c != nil && noiseState != nil {
		ev.Noise = map[pb.DPNoise]string{pb.DPNoise_DP_NOISE_TREE: "tree", pb.DPNoise_DP_NOISE_BLT: "blt"}[c.Noise]
		ev.NoiseStateSHA256 = wire.SHA256(noiseState)
	}
	if clip.next > 0 {
		ev.UnclippedFraction, ev.NextClipNorm = new(clip.fraction), clip.next
	}
	return ev
}

func (t *taskRun) accountantName() string {
	if t.dp.dist != nil {
		return "rdp-" + t.dp.mechanismName()
	}
	if t.dp.cfg.GetAccountant() == pb.Accountant_ACCOUNTANT_PLD {
		return "pld"
	}
	return "rdp"
}

// auditRules are the audit log's names of the round engine's participation rules.
var auditRules = map[string]string{round.RuleMaxRounds: audit.RuleMaxRounds, round.RuleMinSeparation: audit.RuleMinSeparation}

// refusedEvent is the audit record of the devices round r's participation
// limits turned away, by pseudonym; nil when none were, or when the
// coordinator has no pseudonyms to give.
func (t *taskRun) refusedEvent(r *roundRun) audit.Payload {
	t.mu.Lock()
	turned := r.cohort.TurnedAway()
	t.mu.Unlock()
	if len(turned) == 0 || t.c.d.Pseudonym == nil {
		return nil
	}
	ev := audit.ParticipationRefused{Task: t.id, Round: r.row.Round, Step: r.step, MaxRounds: uint64(t.dp.maxRounds()),
		MinSeparation: uint64(t.dp.minSeparation())}
	for _, d := range turned {
		if len(ev.Devices) == audit.MaxRefusedListed {
			ev.More++
			continue
		}
		p, err := t.c.d.Pseudonym(d.Device)
		if err != nil {
			t.log().Error("a refused device's pseudonym", "device", d.Device, "err", err)
			ev.More++
			continue
		}
		ev.Devices = append(ev.Devices, audit.RefusedDevice{Device: p, Rule: auditRules[d.Rule], LastStep: d.LastStep})
	}
	return ev
}
