package coord

import (
	"context"
	"fmt"
	"math"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/model"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/round"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
)

// Defaults for task fields left zero.
const (
	DefaultSelectionTimeout = 30 * time.Second
	DefaultReportTimeout    = 2 * time.Minute
	// DefaultMaxExamplesPerReport caps the weight one report carries in
	// the example-weighted mean, so no device dominates a round by claiming
	// a huge dataset.
	DefaultMaxExamplesPerReport = 10000
	// MaxExamplesPerReport is the largest cap a task may set.
	MaxExamplesPerReport = 1 << 40
	// MaxMetricAbs bounds the magnitude of every metric a device reports:
	// far beyond any loss or accuracy, small enough that weighted sums of
	// them stay finite.
	MaxMetricAbs = round.MaxMetricAbs
)

// Robustness is what bounds one device's influence on a task: the update
// norm bound devices clip to and the server enforces, and the weight cap.
type Robustness struct {
	// MaxUpdateNorm is the L2 bound on each update; 0 only with Unbounded.
	MaxUpdateNorm float64
	// Unbounded is the operator's explicit opt-out of the bound.
	Unbounded bool
	// MaxExamples caps a report's example count as its weight.
	MaxExamples uint64
}

// DefaultUpdateNorm is the update norm bound of a task that sets none: the
// base model's L2 norm, at least 1. One update can then move the model by
// at most its own size, which training never needs and which stops a
// poisoned update from swamping a round.
func DefaultUpdateNorm(base *model.Model) float64 {
	var ss float64
	for _, x := range base.Flatten() {
		ss += float64(x) * float64(x)
	}
	if n := math.Sqrt(ss); n > 1 && !math.IsInf(n, 0) {
		return n
	}
	return 1
}

// ResolveRobustness checks a task's robustness settings and fills in the
// defaults; base is the model the default norm bound derives from. Task
// creation stores the result in the task, so a running task keeps the
// bound it was created with.
func ResolveRobustness(task *pb.Task, base *model.Model) (Robustness, error) {
	agg := task.GetAggregation()
	r := Robustness{MaxUpdateNorm: agg.GetMaxUpdateNorm(), Unbounded: agg.GetUnboundedUpdates(), MaxExamples: agg.GetMaxExamplesPerReport()}
	switch {
	case !(r.MaxUpdateNorm >= 0) || math.IsInf(r.MaxUpdateNorm, 0):
		return Robustness{}, fmt.Errorf("max_update_norm %v must be finite and not negative", r.MaxUpdateNorm)
	case r.Unbounded && r.MaxUpdateNorm > 0:
		return Robustness{}, fmt.Errorf("max_update_norm %v contradicts unbounded_updates; set one", r.MaxUpdateNorm)
	case r.MaxExamples > MaxExamplesPerReport:
		return Robustness{}, fmt.Errorf("max_examples_per_report %d exceeds %d", r.MaxExamples, uint64(MaxExamplesPerReport))
	}
	if r.MaxUpdateNorm == 0 && !r.Unbounded {
		if base == nil {
			return Robustness{}, fmt.Errorf("no update norm bound and no opt-out (unbounded_updates)")
		}
		r.MaxUpdateNorm = DefaultUpdateNorm(base)
	}
	if r.MaxExamples == 0 {
		r.MaxExamples = DefaultMaxExamplesPerReport
	}
	return r, nil
}

// Apply writes the resolved settings into the task's aggregation config.
func (r Robustness) Apply(task *pb.Task) {
	if task.Aggregation == nil {
		task.Aggregation = &pb.AggregationConfig{}
	}
	task.Aggregation.MaxUpdateNorm, task.Aggregation.UnboundedUpdates = r.MaxUpdateNorm, r.Unbounded
	task.Aggregation.MaxExamplesPerReport = r.MaxExamples
}

func (t *taskRun) selectionTimeout() time.Duration {
	if d := t.spec.GetSelectionTimeout().AsDuration(); d > 0 {
		return d
	}
	return DefaultSelectionTimeout
}

func (t *taskRun) reportTimeout() time.Duration {
	if d := t.spec.GetReportTimeout().AsDuration(); d > 0 {
		return d
	}
	return DefaultReportTimeout
}

func (t *taskRun) wanted() int { return Wanted(t.spec) }

func (t *taskRun) open(ctx context.Context, round uint64, kind pb.RoundKind) (*store.RoundRow, error) {
	now := t.c.now()
	rr := &store.RoundRow{TaskID: t.id, Round: round, Kind: kind, State: pb.RoundState_ROUND_STATE_OPEN,
		Seed: t.c.seed(), BaseModel: t.global.Lineage.Version, Open: now,
		Deadline: now.Add(t.selectionTimeout() + t.reportTimeout())}
	if t.secure(kind) {
		// Key advertisement and sharing before the masked input, consistency
		// and unmasking after it.
		rr.Deadline = rr.Deadline.Add(4 * secureStageTimeout(t.spec.GetSecagg()))
	}
	ev := audit.RoundOpened{Task: t.id, Round: round, Model: rr.BaseModel, Module: t.spec.GetModule().GetSha256(),
		CohortSize: uint64(t.wanted()), Eligibility: t.eligibility().Describe(roundKind(kind))}
	if t.secure(kind) {
		// The parameters every participant derives, as the plans carry them.
		// In a round of groups, the groups' in order.
		if _, cfgs, err := t.secureGroups(round, t.wanted(), rr.Seed); err == nil {
			var b []byte
			for _, cfg := range cfgs {
				b, _ = proto.MarshalOptions{Deterministic: true}.MarshalAppend(b, cfg)
			}
			ev.SecAggSHA256 = wire.SHA256(b)
		}
	}
	// Recorded before the round exists: a round the log does not show
	// opened never takes devices.
	_, span := t.auditSpan(ctx, []audit.Payload{ev})
	err := t.c.record(ev)
	endSpan(span, err)
	if err != nil {
		return nil, fmt.Errorf("open round %d: audit: %w", round, err)
	}
	if err := t.c.d.Store.OpenRound(ctx, rr, now); err != nil {
		return nil, err
	}
	t.log().Info("round opened", "round", round, "kind", kind)
	return rr, nil
}

// influence is what bounds one device's influence, as the round engine
// reads the task's robustness and DP settings.
func (t *taskRun) influence() round.Influence {
	i := round.Influence{MaxUpdateNorm: t.robust.MaxUpdateNorm, MaxExamples: t.robust.MaxExamples}
	if t.dp != nil {
		i.DP, i.ClipNorm = true, t.dp.clip
		i.LocalDP = t.dp.cfg.GetMechanism() == pb.DPMechanism_DP_MECHANISM_LOCAL
	}
	return i
}

func (t *taskRun) normBound() float64 { return t.influence().NormBound() }

func (t *taskRun) weight(examples uint64) float64 { return t.influence().Weight(examples) }

// secure reports whether rounds of kind run through secure aggregation:
// training rounds of a task with SecAgg settings. Evaluation rounds report
// plaintext metrics only.
func (t *taskRun) secure(kind pb.RoundKind) bool {
	return kind == pb.RoundKind_ROUND_KIND_TRAIN && t.spec.GetSecagg() != nil
}

func (t *taskRun) plan(rr *store.RoundRow) *pb.RoundPlan {
	m, err := t.c.d.Store.Model(context.Background(), rr.BaseModel)
	size := uint64(0)
	if err == nil {
		size = uint64(m.Size)
	}
	p := &pb.RoundPlan{
		TaskId: t.id, Round: rr.Round, Kind: rr.Kind,
		Model:           &pb.ModelRef{Sha256: rr.BaseModel, Version: rr.BaseModel, SizeBytes: size},
		Module:          t.spec.GetModule(),
		Hyperparameters: t.spec.GetHyperparameters(),
		Seed:            rr.Seed,
		ReportDeadline:  timestamppb.New(rr.Deadline),
		Limits:          t.spec.GetLimits(),
		Secagg:          t.spec.GetSecagg(),
		MaxUpdateNorm:   t.robust.MaxUpdateNorm,
	}
	if rr.Kind == pb.RoundKind_ROUND_KIND_TRAIN {
		p.UpdateEncoding = t.spec.GetUpdateEncoding()
		p.Trainable = planTrainable(t.train)
	}
	if t.dp != nil && rr.Kind == pb.RoundKind_ROUND_KIND_TRAIN {
		// Devices clip to the round's DP bound; evaluation rounds release
		// metrics only.
		p.Dp, p.MaxUpdateNorm = t.dp.roundConfig(), t.dp.clip
	}
	return p
}
