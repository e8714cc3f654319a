package poolsvc

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetlearn/fleetlearn/aggregator"
	"github.com/fleetlearn/fleetlearn/aggregator/quant"
	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/atomicfile"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/train"
	"github.com/fleetlearn/fleetlearn/pool"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
)

// Bounds and defaults of a DiLoCo job.
const (
	MinIslands   = 2
	MaxIslands   = 64
	DefaultGrace = 30 * time.Second
	maxGrace     = 24 * time.Hour
	maxOuterLR   = 10
)

// dilocoRT is a DiLoCo job's outer loop, held by its parent job. The
// parent is not scheduled: its islands are jobs of their own, and the
// parent's state follows theirs and the outer steps.
type dilocoRT struct {
	islands []string // child job ids, by island
	inner   int64    // H
	steps   int64    // outer steps of the run
	quorum  int
	grace   time.Duration
	int8    bool

	outer  *aggregator.Outer
	theta  []float32
	layout model.Layout
	// maxNorm bounds the L2 norm of one island's pseudo-gradient: θ₀'s
	// norm, at least 1, the federated path's default update bound
	// (coord.DefaultUpdateNorm). H honest inner steps move the model far
	// less than its own size; a larger Δᵢ is a lie, or a run that diverged.
	maxNorm float64
	step    int64 // outer steps taken; theta is θ_step
	open    *outerRound
	// closing is the round whose contributions are being read back off
	// the loop; it ends in finishOuter. Contributions for its step wait
	// for it.
	closing *outerRound
	// last is the round that produced θ_step, kept so that an island
	// whose answer was lost gets the same answer again.
	last *outerRound
}

// outerRound collects the islands' pseudo-gradients for one outer step.
type outerRound struct {
	step int64
	// spools are the checked contributions on disk, by island; nil once
	// the round has closed.
	spools   map[uint32]spooled
	sum      map[uint32][32]byte // digest of what the island sent, for retries
	weight   map[uint32]float64
	quorumAt time.Time // when it reached its quorum; zero before
	done     chan struct{}
	resp     outerAnswer
	err      error
}

// outerAnswer is what an OuterSync stream sends back: the result, then
// params in chunks. params is never written once handed out (θ is
// replaced, not updated, by an outer step), so streams read it unlocked.
type outerAnswer struct {
	step       int64
	params     []float32
	done, late bool
}

func newOuterRound(step int64) *outerRound {
	return &outerRound{step: step, spools: map[uint32]spooled{}, sum: map[uint32][32]byte{},
		weight: map[uint32]float64{}, done: make(chan struct{})}
}

func (r *outerRound) finish(resp outerAnswer, err error) {
	r.resp, r.err = resp, err
	close(r.done)
}

// end finishes a round that will not close, deleting its spools.
func (r *outerRound) end(err error) {
	removeSpools(slices.Collect(maps.Values(r.spools)))
	r.spools = nil
	r.finish(outerAnswer{}, err)
}

// dilocoParams resolves a valid spec's defaults.
func dilocoParams(d *pb.PoolDiLoCo) (lr, mu float64, quorum int, grace time.Duration) {
	lr, mu, quorum, grace = d.GetOuterLearningRate(), aggregator.DefaultOuterMomentum, int(d.GetQuorum()), DefaultGrace
	if lr == 0 {
		lr = aggregator.DefaultOuterLR
	}
	if d.OuterMomentum != nil {
		mu = d.GetOuterMomentum()
	}
	if quorum == 0 {
		quorum = int(d.GetIslands())/2 + 1
	}
	if d.GetGrace() != nil {
		grace = d.GetGrace().AsDuration()
	}
	return lr, mu, quorum, grace
}

// checkDiLoCo bounds a DiLoCo job's spec and fills in the checkpoint
// interval, which for islands is the outer step.
func checkDiLoCo(in *pb.PoolJobSpec) error {
	d := in.GetDiloco()
	b := in.GetBuiltin()
	switch {
	case b == nil:
		return invalidf("spec.diloco: islands run the built-in trainer; a command job cannot be split into islands")
	case in.GetRanks() != 1:
		return invalidf("spec.ranks %d: a DiLoCo island is one rank; the islands (spec.diloco.islands) run side by side", in.GetRanks())
	case d.GetIslands() < MinIslands || d.GetIslands() > MaxIslands:
		return invalidf("spec.diloco.islands %d outside [%d, %d]", d.GetIslands(), MinIslands, MaxIslands)
	case len(in.GetId()) > pool.MaxNameLen-len(islandSuffix(MaxIslands-1)):
		return invalidf("spec.id: at most %d bytes for a DiLoCo job, whose islands are named ID-iN", pool.MaxNameLen-len(islandSuffix(MaxIslands-1)))
	case d.GetInnerSteps() < 1 || d.GetInnerSteps() > in.GetTotalSteps():
		return invalidf("spec.diloco.inner_steps %d outside [1, total_steps %d]", d.GetInnerSteps(), in.GetTotalSteps())
	case in.GetTotalSteps()%d.GetInnerSteps() != 0:
		return invalidf("spec.total_steps %d is not a multiple of spec.diloco.inner_steps %d", in.GetTotalSteps(), d.GetInnerSteps())
	case in.GetCheckpointInterval() != 0 && in.GetCheckpointInterval() != d.GetInnerSteps():
		return invalidf("spec.checkpoint_interval %d: a DiLoCo job's checkpoints are its outer steps; leave it 0 or set it to inner_steps %d",
			in.GetCheckpointInterval(), d.GetInnerSteps())
	case b.GetSyncEvery() != 0:
		return invalidf("spec.builtin.sync_every: islands sync through the outer step; leave it 0")
	case b.GetInitModel() != "":
		return invalidf("spec.builtin.init_model: a DiLoCo job starts from builtin.init_seed (an MLP of builtin.arch); starting islands from a registered model, a language model among them, is not supported")
	case in.GetCarbon() != nil:
		return invalidf("spec.carbon: carbon-aware placement plans one gang; it is not combined with DiLoCo islands")
	}
	// Pseudo-gradients stream in chunks; only the ceiling on a streamed
	// vector bounds the model (checkBuiltin's own bound is lower today).
	if params := archParams(b.GetArch()); params > MaxSyncParams {
		return invalidf("spec.builtin.arch: %d parameters; a DiLoCo island's pseudo-gradient has at most %d", params, MaxSyncParams)
	}
	lr := d.GetOuterLearningRate()
	if math.IsNaN(lr) || lr < 0 || lr > maxOuterLR {
		return invalidf("spec.diloco.outer_learning_rate %v: want a number in (0, %d], or 0 for %v", lr, maxOuterLR, aggregator.DefaultOuterLR)
	}
	if d.OuterMomentum != nil {
		if mu := d.GetOuterMomentum(); !(mu >= 0 && mu < 1) {
			return invalidf("spec.diloco.outer_momentum %v outside [0, 1)", mu)
		}
	}
	if d.GetQuorum() > d.GetIslands() {
		return invalidf("spec.diloco.quorum %d exceeds islands %d", d.GetQuorum(), d.GetIslands())
	}
	if g := d.GetGrace(); g != nil {
		if err := g.CheckValid(); err != nil || g.AsDuration() <= 0 || g.AsDuration() > maxGrace {
			return invalidf("spec.diloco.grace %v: want a duration in (0, %s]", g.AsDuration(), maxGrace)
		}
	}
	in.CheckpointInterval = d.GetInnerSteps()
	return nil
}

func islandSuffix(i int) string { return "-i" + strconv.Itoa(i) }

// islandSpec is island i's spec: the parent's, under its own id.
func islandSpec(parent *pb.PoolJobSpec, i int) *pb.PoolJobSpec {
	c := proto.CloneOf(parent)
	c.Id = parent.GetId() + islandSuffix(i)
	return c
}

// newDiLoCo builds the outer loop at θ₀ for a checked spec.
func newDiLoCo(in *pb.PoolJobSpec) (*dilocoRT, error) {
	d := in.GetDiloco()
	arch := make([]int, len(in.GetBuiltin().GetArch()))
	for i, w := range in.GetBuiltin().GetArch() {
		arch[i] = int(w)
	}
	m, err := train.InitMLP(arch, in.GetBuiltin().GetInitSeed())
	if err != nil {
		return nil, invalidf("spec.builtin.arch: %v", err)
	}
	lr, mu, quorum, grace := dilocoParams(d)
	o, err := aggregator.NewOuter(m.Layout().Size(), aggregator.WithServerLR(lr), aggregator.WithMomentum(mu))
	if err != nil {
		return nil, invalidf("spec.diloco: %v", err)
	}
	rt := &dilocoRT{inner: d.GetInnerSteps(), steps: in.GetTotalSteps() / d.GetInnerSteps(), quorum: quorum, grace: grace,
		int8: d.GetInt8(), outer: o, theta: m.Flatten(), layout: m.Layout()}
	rt.maxNorm = max(1, l2(rt.theta))
	for i := range int(d.GetIslands()) {
		rt.islands = append(rt.islands, in.GetId()+islandSuffix(i))
	}
	return rt, nil
}

// submitDiLoCo records a DiLoCo job and queues its islands; it runs on the
// loop. The outer state is written first, so a job on record always has
// one.
func (s *Service) submitDiLoCo(ctx context.Context, in *pb.PoolJobSpec, rec *pb.PoolJob, then *pb.Task, sp pool.Spec) error {
	d, err := newDiLoCo(in)
	if err != nil {
		return err
	}
	now := s.clk.Now()
	var kids []*jobRT
	for i, id := range d.islands {
		if _, ok := s.jobs[id]; ok {
			return errorf(codes.AlreadyExists, "submit job: island id %s is taken; choose another job id", id)
		}
		if _, err := s.d.Store.PoolJob(ctx, id); err == nil {
			return errorf(codes.AlreadyExists, "submit job: island id %s is taken; choose another job id", id)
		}
		cs := islandSpec(in, i)
		csp, err := specOf(cs, now)
		if err != nil {
			return err
		}
		crec := &pb.PoolJob{Spec: cs, SpecDigest: csp.Digest(), State: pb.PoolJobState_POOL_JOB_STATE_QUEUED,
			StateReason: fmt.Sprintf("submitted as island %d of %s", i, sp.ID), Submitter: rec.GetSubmitter(),
			SubmitTime: timestamppb.New(now), Usage: &pb.PoolUsage{}, Parent: sp.ID, Island: uint32(i)}
		kids = append(kids, newJobRT(crec, nil, csp))
	}
	if err := s.saveOuter(sp.ID, d); err != nil {
		s.log.Error("storing a DiLoCo job's outer state", "job", sp.ID, "err", err)
		return errorf(codes.Internal, "submit job: storing the outer state failed; nothing was queued")
	}
	rec.Diloco = &pb.PoolDiLoCoStatus{OuterSteps: d.steps}
	rec.StateReason = fmt.Sprintf("waiting for islands: outer step 0 of %d", d.steps)
	rt := newJobRT(rec, then, sp)
	rt.diloco = d
	evs := []audit.Payload{s.poolJobEvent(rt, "")}
	for _, k := range kids {
		evs = append(evs, s.poolJobEvent(k, ""))
	}
	if err := s.audit(ctx, evs...); err != nil {
		return errorf(codes.Internal, "submit job: the audit log did not take the submission; nothing was queued")
	}
	if err := s.d.Store.InsertPoolJob(ctx, rec, then); err != nil {
		s.log.Error("storing a pool job", "job", sp.ID, "err", err)
		return errorf(codes.Internal, "submit job: storage failed")
	}
	s.jobs[sp.ID] = rt
	for _, k := range kids {
		if err := s.d.Store.InsertPoolJob(ctx, k.rec, nil); err != nil {
			s.log.Error("storing a pool job", "job", k.id(), "err", err)
			s.failDiLoCo(rt, "storing island "+k.id()+" failed")
			return errorf(codes.Internal, "submit job: storage failed")
		}
		if err := s.sched.Submit(k.spec); err != nil {
			s.failDiLoCo(rt, "scheduling island "+k.id()+" failed")
			return invalidf("submit job: island %s: %v", k.id(), err)
		}
		s.jobs[k.id()] = k
	}
	return nil
}

// parentOf returns an island's DiLoCo job, if it is held.
func (s *Service) parentOf(rt *jobRT) *jobRT {
	if rt.rec.GetParent() == "" {
		return nil
	}
	if p := s.jobs[rt.rec.GetParent()]; p != nil && p.diloco != nil {
		return p
	}
	return nil
}

func l2(v []float32) float64 {
	var ss float64
	for _, x := range v {
		ss += float64(x) * float64(x)
	}
	return math.Sqrt(ss)
}

// checkPseudoGradientNorm refuses a pseudo-gradient of L2 norm n longer
// than the job's bound. Finite float32 values alone still allow 1e30 per
// value, which the outer step would apply in full.
func checkPseudoGradientNorm(n, bound float64) error {
	if !(n <= bound*(1+aggregator.NormTolerance)) {
		return invalidf("pseudo_gradient: L2 norm %.6g exceeds the job's bound %.6g (the initial parameters' norm): "+
			"H inner steps do not move an honest island that far; lower the learning rate or inner_steps if training diverged", n, bound)
	}
	return nil
}

// countedWeights are the weights the outer mean gives the islands: each
// claimed example count, but at most one more than the round's smallest.
// Island i trains on examples i mod N of one slice, so honest counts
// differ by at most one and keep their values; an island claiming 2^31
// counts as much as its peers, not as the whole round. clamped lists the
// islands whose claim was cut, for the job's log.
func countedWeights(ws []float64) (counted []float64, clamped []int) {
	if len(ws) == 0 {
		return nil, nil
	}
	ceil := slices.Min(ws) + 1
	counted = make([]float64, len(ws))
	for i, w := range ws {
		counted[i] = min(w, ceil)
		if w > ceil {
			clamped = append(clamped, i)
		}
	}
	return counted, clamped
}

// outerOpen checks an island's OuterSync start on the loop. A join, or a
// stream to a run that has taken its last step, is answered at once.
// Otherwise it says how to take the bytes: spooled and checked when they
// may join the open step, only hashed when they can only be a retry of a
// contribution already taken, or late.
func (s *Service) outerOpen(island *jobRT, st *pb.OuterSyncStart) (*outerAnswer, intakeSpec, error) {
	p := s.parentOf(island)
	if p == nil {
		return nil, intakeSpec{}, errorf(codes.FailedPrecondition, "outer sync: job %s is not an island of a running DiLoCo job", island.id())
	}
	d := p.diloco
	if d.step >= d.steps {
		a := d.current(true, false)
		return &a, intakeSpec{}, nil
	}
	if p.terminal() {
		return nil, intakeSpec{}, errorf(codes.FailedPrecondition, "outer sync: DiLoCo job %s has ended (%s): stop this island", p.id(), p.rec.GetState())
	}
	if st.GetSize() == 0 {
		a := d.current(false, false)
		return &a, intakeSpec{}, nil
	}
	step, idx, size, dim := st.GetOuterStep(), island.rec.GetIsland(), st.GetSize(), int64(len(d.theta))
	if step > d.step || step < 0 {
		return nil, intakeSpec{}, invalidf("outer sync: outer step %d, but the run is at %d; contribute for the step of the parameters you started from", step, d.step)
	}
	// The shortest FLQ8 encoding has the largest blocks; the decoder
	// checks the exact length once it has read the header.
	if minQ := 13 + 4*((dim+quant.MaxBlock-1)/quant.MaxBlock) + dim; d.int8 && (size < minQ || size > maxFLQ8Bytes(dim)) {
		return nil, intakeSpec{}, invalidf("outer sync: pseudo_gradient: %d bytes, but the job sends int8 (FLQ8) pseudo-gradients of %d values, %d to %d bytes",
			size, dim, minQ, maxFLQ8Bytes(dim))
	} else if !d.int8 && size != 4*dim {
		return nil, intakeSpec{}, invalidf("outer sync: pseudo_gradient: %d bytes, but the model has %d parameters: the job sends float32 pseudo-gradients of %d bytes",
			size, dim, 4*dim)
	}
	sp := intakeSpec{op: "outer sync: pseudo_gradient", size: size, dim: len(d.theta), int8: d.int8, weight: st.GetWeight()}
	if r := d.open; step == d.step && d.closing == nil && (r == nil || !hasKey(r.sum, idx)) {
		sp.spool = filepath.Join(s.spoolDir(), p.id())
	}
	return nil, sp, nil
}

func hasKey[K comparable, V any](m map[K]V, k K) bool {
	_, ok := m[k]
	return ok
}

// outerReply is what an island's finished contribution gets: an answer at
// once, or a round to wait for (and with late, to answer as late).
type outerReply struct {
	now  *outerAnswer
	wait *outerRound
	late bool
	took bool // the round holds the contribution's spool now
}

// outerContribute is OuterSync's work on the loop once the island's bytes
// are in: it answers at once (done, late, retry of a closed step) or
// returns the round to wait for.
func (s *Service) outerContribute(island *jobRT, st *pb.OuterSyncStart, c contribution) (outerReply, error) {
	p := s.parentOf(island)
	if p == nil {
		return outerReply{}, errorf(codes.FailedPrecondition, "outer sync: job %s is not an island of a running DiLoCo job", island.id())
	}
	d := p.diloco
	if d.step >= d.steps {
		a := d.current(true, false)
		return outerReply{now: &a}, nil
	}
	if p.terminal() {
		return outerReply{}, errorf(codes.FailedPrecondition, "outer sync: DiLoCo job %s has ended (%s): stop this island", p.id(), p.rec.GetState())
	}
	step, idx := st.GetOuterStep(), island.rec.GetIsland()
	late := func() {
		p.rec.Diloco.LateContributions++
		s.log.Info("DiLoCo island contributed after its outer step closed", "job", p.id(), "island", idx, "step", step, "now", d.step)
	}
	if step < d.step {
		// A retry of a contribution the last step used gets that step's
		// answer; anything else arrived after its step closed.
		if l := d.last; l != nil && l.step == step && l.sum[idx] == c.sum {
			return outerReply{now: &l.resp}, nil
		}
		late()
		a := d.current(false, true)
		return outerReply{now: &a}, nil
	}
	if r := d.closing; r != nil {
		// The step is being taken: a retry of a contribution it uses waits
		// for it; anything else missed it and gets its result as late.
		if prev, ok := r.sum[idx]; ok && prev == c.sum {
			return outerReply{wait: r}, nil
		}
		late()
		return outerReply{wait: r, late: true}, nil
	}
	r := d.open
	if r != nil {
		if prev, ok := r.sum[idx]; ok {
			if prev == c.sum {
				return outerReply{wait: r}, nil
			}
			return outerReply{}, invalidf("outer sync: island %d already contributed to outer step %d; each step once", idx, step)
		}
	}
	if c.path == "" {
		// Only hashed, as a retry, but what it would retry is gone.
		return outerReply{}, errorf(codes.Unavailable, "outer sync: outer step %d changed while island %d's contribution streamed; send it again", step, idx)
	}
	if err := checkPseudoGradientNorm(c.norm, d.maxNorm); err != nil {
		return outerReply{}, err
	}
	if r == nil {
		r = newOuterRound(d.step)
		d.open = r
	}
	r.spools[idx], r.sum[idx], r.weight[idx] = c.spooled, c.sum, c.weight
	if len(r.spools) == d.quorum {
		r.quorumAt = s.clk.Now()
	}
	s.advanceDiLoCo(p)
	return outerReply{wait: r, took: true}, nil
}

// current is the answer that hands out θ_step as it stands.
func (d *dilocoRT) current(done, late bool) outerAnswer {
	return outerAnswer{step: d.step, params: d.theta, done: done, late: late}
}

// advanceDiLoCo moves a DiLoCo job along: it starts running with its first
// placed island, closes an open outer step that has what it needs, fails
// when too few islands can still contribute, and hands off once the last
// step is taken and its islands are done.
func (s *Service) advanceDiLoCo(p *jobRT) {
	d := p.diloco
	if p.terminal() {
		return
	}
	if p.final {
		for _, id := range d.islands {
			if k := s.jobs[id]; k != nil && !k.terminal() {
				return
			}
		}
		s.handoff(p)
		return
	}
	live, alive := 0, 0
	for _, id := range d.islands {
		k := s.jobs[id]
		if k == nil || k.terminal() {
			continue
		}
		alive++
		if k.live {
			live++
		}
	}
	if alive < d.quorum {
		s.failDiLoCo(p, fmt.Sprintf("%d of %d islands can still run, fewer than the quorum %d", alive, len(d.islands), d.quorum))
		return
	}
	if p.rec.GetState() == pb.PoolJobState_POOL_JOB_STATE_QUEUED && live > 0 {
		s.transition(p, pb.PoolJobState_POOL_JOB_STATE_RUNNING, fmt.Sprintf("outer step %d of %d", d.step, d.steps))
	}
	r := d.open
	if r == nil || len(r.spools) < d.quorum {
		return
	}
	// The round waits for every running island, for at most the grace
	// window after its quorum; islands that are not running (lost,
	// requeued, preempted) are not waited for.
	waiting := 0
	for i, id := range d.islands {
		if _, ok := r.spools[uint32(i)]; ok {
			continue
		}
		if k := s.jobs[id]; k != nil && k.live {
			waiting++
		}
	}
	if waiting > 0 && s.clk.Now().Before(r.quorumAt.Add(d.grace)) {
		return
	}
	s.closeOuter(p)
}

// closeOuter starts the outer step from the open round's contributions:
// their spools are read back off the loop, in island order, and the step
// is taken on the loop by finishOuter.
func (s *Service) closeOuter(p *jobRT) {
	d := p.diloco
	r := d.open
	d.open, d.closing = nil, r
	ids := slices.Sorted(maps.Keys(r.spools))
	ps := make([]spooled, len(ids))
	ws := make([]float64, len(ids))
	for j, i := range ids {
		ps[j], ws[j] = r.spools[i], r.weight[i]
	}
	// The spools are the fold's now; the digests stay for retries.
	r.spools = nil
	counted, clamped := countedWeights(ws)
	dim, int8 := len(d.theta), d.int8
	go func() {
		mean, err := foldSpools(dim, int8, ps, counted, s.stop)
		removeSpools(ps)
		f := outerFold{ids: ids, claimed: ws, counted: counted, clamped: clamped, mean: mean, err: err}
		_ = s.do(context.Background(), func() error {
			s.finishOuter(p, r, f)
			return nil
		})
	}()
}

// outerFold is a closing round's contributions as read back.
type outerFold struct {
	ids              []uint32
	claimed, counted []float64
	clamped          []int
	mean             []float32
	err              error
}

// finishOuter takes the outer step from a closing round's mean.
func (s *Service) finishOuter(p *jobRT, r *outerRound, f outerFold) {
	d := p.diloco
	if d.closing != r {
		return // the job ended meanwhile, and the round with it
	}
	d.closing = nil
	if f.err != nil {
		s.log.Error("DiLoCo outer step could not be formed", "job", p.id(), "step", r.step, "err", f.err)
		r.finish(outerAnswer{}, errorf(codes.Internal, "outer step %d of job %s could not be formed: %v; rejoin", r.step, p.id(), f.err))
		return
	}
	// θ is replaced, not updated: answers still streaming read the old one.
	theta := slices.Clone(d.theta)
	if err := d.outer.Apply(theta, f.mean); err != nil {
		// θ is unchanged: the islands' ranks fail, restart and rejoin at
		// this step.
		s.log.Error("DiLoCo outer step failed", "job", p.id(), "step", r.step, "err", err)
		r.finish(outerAnswer{}, errorf(codes.FailedPrecondition, "outer step %d of job %s failed: %v; rejoin", r.step, p.id(), err))
		return
	}
	d.theta = theta
	d.step++
	d.last = r
	// Nothing of the step is handed out before it is stored: islands
	// checkpoint at it, and a restart must resume from it.
	if err := s.saveOuter(p.id(), d); err != nil {
		s.log.Error("storing a DiLoCo job's outer state", "job", p.id(), "step", d.step, "err", err)
		r.finish(outerAnswer{}, errorf(codes.Internal, "outer step %d of job %s could not be stored", r.step, p.id()))
		s.failDiLoCo(p, fmt.Sprintf("storing outer step %d failed: %v", d.step, err))
		return
	}
	ids := f.ids
	p.rec.Diloco.OuterStep = d.step
	p.rec.Diloco.LastIslands = ids
	p.rec.Step, p.rec.CommittedStep = d.step*d.inner, d.step*d.inner
	done := d.step >= d.steps
	r.finish(outerAnswer{step: d.step, params: d.theta, done: done}, nil)
	s.log.Info("DiLoCo outer step", "job", p.id(), "step", d.step, "of", d.steps, "islands", ids)
	var cut []string
	for _, j := range f.clamped {
		cut = append(cut, fmt.Sprintf("island %d claimed %v examples, counted as %v", ids[j], f.claimed[j], f.counted[j]))
		s.log.Warn("DiLoCo island claimed more examples than its peers", "job", p.id(), "island", ids[j], "claimed", f.claimed[j], "counted", f.counted[j])
	}
	s.outerLog(p, ids, cut)
	// An outer step is every island's checkpoint: what it trained is in θ.
	for _, id := range d.islands {
		k := s.jobs[id]
		if k == nil || k.terminal() {
			continue
		}
		if k.live {
			s.checkpointed(k, d.step*d.inner)
		} else if done {
			if err := s.sched.Cancel(id); err != nil {
				s.log.Error("ending an absent island", "job", id, "err", err)
			}
			s.transition(k, pb.PoolJobState_POOL_JOB_STATE_SUCCEEDED, "the run took its last outer step while this island was away")
		}
	}
	if !done {
		p.rec.StateReason = fmt.Sprintf("outer step %d of %d", d.step, d.steps)
		s.save(p)
		return
	}
	p.final = true
	p.handoffDue = s.clk.Now().Add(s.lossAfter())
	p.rec.StateReason = fmt.Sprintf("took the last outer step, %d of %d; storing the model", d.step, d.steps)
	s.save(p)
	s.advanceDiLoCo(p)
}

// outerLog writes an outer step's line to the job's log, where an
// operator following it sees which islands took part.
func (s *Service) outerLog(p *jobRT, ids []uint32, notes []string) {
	d := p.diloco
	var absent []uint32
	for i := range d.islands {
		if !slices.Contains(ids, uint32(i)) {
			absent = append(absent, uint32(i))
		}
	}
	text := fmt.Sprintf("outer step %d of %d: islands %v", d.step, d.steps, ids)
	if len(absent) > 0 {
		text += fmt.Sprintf(", without %v", absent)
	}
	if n := p.rec.Diloco.GetLateContributions(); n > 0 {
		text += fmt.Sprintf("; %d late contributions so far", n)
	}
	for _, n := range notes {
		text += "; " + n
	}
	line := &pb.PoolLogLine{Stream: "agent", Text: clip(text, MaxLogLineBytes), Time: nowProto(s.clk)}
	if _, err := s.d.Store.AppendPoolLogs(context.Background(), p.id(), []*pb.PoolLogLine{line}, MaxLogLines); err != nil {
		s.log.Error("storing pool logs", "job", p.id(), "err", err)
		return
	}
	s.logs.notify(p.id())
}

// failDiLoCo ends a DiLoCo job and its islands.
func (s *Service) failDiLoCo(p *jobRT, why string) {
	s.endDiLoCo(p, pb.PoolJobState_POOL_JOB_STATE_FAILED, why)
}

// endDiLoCo moves the job to a final state, stops its islands and ends the
// open round's waiters.
func (s *Service) endDiLoCo(p *jobRT, st pb.PoolJobState, why string) {
	d := p.diloco
	for _, r := range []*outerRound{d.open, d.closing} {
		if r != nil {
			r.end(errorf(codes.Aborted, "outer step %d of job %s abandoned: %s", r.step, p.id(), why))
		}
	}
	d.open, d.closing = nil, nil
	p.final, p.handoffDue = false, timeZero
	s.sumIslandUsage(p)
	s.transition(p, st, clip(why, 1024))
	for _, id := range d.islands {
		k := s.jobs[id]
		if k == nil || k.terminal() {
			continue
		}
		if err := s.sched.Cancel(id); err != nil {
			s.log.Error("ending an island", "job", id, "err", err)
		}
		s.stopNow(k, st, "its DiLoCo job ended: "+clip(why, 900))
	}
}

// sumIslandUsage makes the parent's usage its islands'.
func (s *Service) sumIslandUsage(p *jobRT) {
	u := &pb.PoolUsage{}
	for _, id := range p.diloco.islands {
		k := s.jobs[id]
		if k == nil {
			continue
		}
		ku := k.rec.GetUsage()
		u.CpuSeconds += ku.GetCpuSeconds()
		u.GpuSeconds += ku.GetGpuSeconds()
		u.GpuBusySeconds += ku.GetGpuBusySeconds()
		u.EnergyJoules += ku.GetEnergyJoules()
		u.PeakMemoryBytes = max(u.PeakMemoryBytes, ku.GetPeakMemoryBytes())
		if u.Meter == "" {
			u.Meter, u.EnergySource = ku.GetMeter(), ku.GetEnergySource()
		}
	}
	p.rec.Usage = u
}

// handoffDiLoCo stores θ as the job's model, with the islands' usage and
// data in its lineage.
func (s *Service) handoffDiLoCo(p *jobRT) {
	p.final, p.handoffDue = false, timeZero
	d := p.diloco
	ctx := context.Background()
	s.sumIslandUsage(p)
	p.rec.DataSha256 = s.islandData(p)
	reason := fmt.Sprintf("completed %d outer steps of %d inner steps", d.steps, d.inner)
	m, ev, err := s.storeOuterModel(ctx, p)
	s.succeeded(ctx, p, reason, m, ev, err)
}

// islandData is the SHA-256 over the islands' data digests in island
// order; "" unless each island reported one.
func (s *Service) islandData(p *jobRT) string {
	ds := make([]string, len(p.diloco.islands))
	for i, id := range p.diloco.islands {
		if k := s.jobs[id]; k != nil {
			ds[i] = k.rec.GetDataSha256()
		}
	}
	return digestOfDigests(ds)
}

func (s *Service) storeOuterModel(ctx context.Context, p *jobRT) (*pb.Model, audit.ModelImported, error) {
	d := p.diloco
	m, err := d.layout.Unflatten(d.theta)
	if err != nil {
		return nil, audit.ModelImported{}, err
	}
	m.Lineage = model.Lineage{Job: p.id(), Source: "pool"}
	if err := m.Validate(); err != nil {
		return nil, audit.ModelImported{}, err
	}
	sum, err := outerStateDigest(s.outerPath(p.id()))
	if err != nil {
		return nil, audit.ModelImported{}, err
	}
	lin := &pb.PoolLineage{JobId: p.id(), SpecDigest: p.rec.SpecDigest, DataSha256: p.rec.DataSha256,
		Checkpoint: sum, Usage: proto.CloneOf(p.rec.Usage), Steps: p.spec.TotalSteps}
	out, err := s.d.StoreModel(ctx, p.spec.OutputModel, m, lin)
	if err != nil {
		return nil, audit.ModelImported{}, err
	}
	return out, imported(out, p.spec.OutputModel, p.id()), nil
}

// Outer state file, version 1, little-endian, in the job's checkpoint
// directory, replaced atomically after every outer step:
//
//	[0:4]   magic "FLOS"
//	[4]     version (1)
//	[5:13]  outer steps taken, uint64
//	[13:21] dim, uint64
//	        θ, dim float32
//	        length of the optimizer state, uint64, then aggregator.Outer's encoding
//	        SHA-256 of everything before it
const (
	outerFileMagic   = "FLOS"
	outerFileVersion = 1
	outerFileName    = "outer.state"
)

// ErrOuterState reports an outer state file that cannot be used.
var ErrOuterState = errors.New("poolsvc: bad outer state")

func (s *Service) outerPath(job string) string {
	return filepath.Join(s.ckpt.jobDir(job), outerFileName)
}

func (s *Service) saveOuter(job string, d *dilocoRT) error {
	ob, err := d.outer.MarshalBinary()
	if err != nil {
		return err
	}
	b := make([]byte, 0, 21+4*len(d.theta)+8+len(ob)+sha256.Size)
	b = append(b, outerFileMagic...)
	b = append(b, outerFileVersion)
	b = binary.LittleEndian.AppendUint64(b, uint64(d.step))
	b = binary.LittleEndian.AppendUint64(b, uint64(len(d.theta)))
	for _, v := range d.theta {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	}
	b = binary.LittleEndian.AppendUint64(b, uint64(len(ob)))
	b = append(b, ob...)
	sum := sha256.Sum256(b)
	b = append(b, sum[:]...)
	path := s.outerPath(job)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return atomicfile.WriteFile(path, b, 0o600)
}

// loadOuter restores d's step, θ and optimizer from the job's file.
func (s *Service) loadOuter(job string, d *dilocoRT) error {
	b, err := os.ReadFile(s.outerPath(job))
	if err != nil {
		return fmt.Errorf("%w: %w", ErrOuterState, err)
	}
	if err := decodeOuterState(b, d); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrOuterState, s.outerPath(job), err)
	}
	return nil
}

func decodeOuterState(b []byte, d *dilocoRT) error {
	if len(b) < 21+8+sha256.Size || string(b[:4]) != outerFileMagic || b[4] != outerFileVersion {
		return errors.New("not a version 1 outer state file")
	}
	body := b[:len(b)-sha256.Size]
	if sum := sha256.Sum256(body); string(sum[:]) != string(b[len(body):]) {
		return errors.New("checksum mismatch")
	}
	step := binary.LittleEndian.Uint64(body[5:])
	dim := binary.LittleEndian.Uint64(body[13:])
	if dim != uint64(len(d.theta)) || step > uint64(d.steps) {
		return fmt.Errorf("dim %d at step %d, the job has %d parameters and %d outer steps", dim, step, len(d.theta), d.steps)
	}
	rest := body[21:]
	if uint64(len(rest)) < 4*dim+8 {
		return errors.New("truncated")
	}
	theta := make([]float32, dim)
	for i := range theta {
		theta[i] = math.Float32frombits(binary.LittleEndian.Uint32(rest[4*i:]))
		if math.IsNaN(float64(theta[i])) || math.IsInf(float64(theta[i]), 0) {
			return fmt.Errorf("theta[%d] is %v", i, theta[i])
		}
	}
	rest = rest[4*dim:]
	n := binary.LittleEndian.Uint64(rest)
	if n != uint64(len(rest)-8) {
		return errors.New("optimizer state length mismatch")
	}
	if err := d.outer.UnmarshalBinary(rest[8:]); err != nil {
		return err
	}
	d.theta, d.step = theta, int64(step)
	return nil
}

// outerStateDigest is the hex SHA-256 of the outer state file, the
// checkpoint a DiLoCo job's model came from.
func outerStateDigest(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

// restoreDiLoCo rebuilds a DiLoCo job's outer loop from its spec and file;
// the job stays as it was recorded, its islands come back on their own.
func (s *Service) restoreDiLoCo(rec *pb.PoolJob, then *pb.Task, sp pool.Spec) error {
	d, err := newDiLoCo(rec.GetSpec())
	if err != nil {
		return err
	}
	rt := newJobRT(rec, then, sp)
	rt.diloco = d
	if rec.Diloco == nil {
		rec.Diloco = &pb.PoolDiLoCoStatus{OuterSteps: d.steps}
	}
	s.jobs[sp.ID] = rt
	if err := s.loadOuter(sp.ID, d); err != nil {
		s.log.Error("restoring a DiLoCo job", "job", sp.ID, "err", err)
		s.transition(rt, pb.PoolJobState_POOL_JOB_STATE_FAILED, clip("server restarted and its outer state could not be read: "+err.Error(), 1024))
		return nil
	}
	rec.Diloco.OuterStep = d.step
	if d.step >= d.steps {
		// The last step was taken but the model was not stored.
		rt.final, rt.handoffDue = true, s.clk.Now().Add(s.lossAfter())
	}
	rt.rec.StateReason = fmt.Sprintf("server restarted at outer step %d of %d", d.step, d.steps)
	s.save(rt)
	return nil
}

// dilocoDeadline is the earliest grace window end of an open outer step.
func (s *Service) dilocoDeadline() time.Time {
	var next time.Time
	for _, rt := range s.jobs {
		if d := rt.diloco; d != nil && d.open != nil && !d.open.quorumAt.IsZero() {
			if dl := d.open.quorumAt.Add(d.grace); next.IsZero() || dl.Before(next) {
				next = dl
			}
		}
	}
	return next
}

// OuterSync implements PoolWorkerService.OuterSync.
func (v *workerServer) OuterSync(stream apiv1.PoolWorkerService_OuterSyncServer) error {
	s := v.s
	ctx := stream.Context()
	p, err := principal(ctx)
	if err != nil {
		return err
	}
	first, err := stream.Recv()
	if err != nil {
		return streamErr("outer sync", err)
	}
	st := first.GetStart()
	if st == nil {
		return invalidf("outer sync: the stream must open with start (ref, outer_step, weight, size), then the pseudo-gradient in chunks; a worker that sends it in one message predates streamed outer syncs: upgrade it")
	}
	size := st.GetSize()
	if size < 0 || size > 4*MaxSyncParams {
		return invalidf("outer sync: size %d: want the pseudo-gradient's bytes, at most %d, or 0 to join", size, 4*MaxSyncParams)
	}
	if w := st.GetWeight(); size > 0 && (math.IsNaN(w) || w < 1 || w > 1<<31 || w != math.Trunc(w)) {
		return invalidf("outer sync: weight %v: want the island's example count, an integer in [1, 2^31]", w)
	}
	ref := st.GetRef()
	key := rankAttempt{ref.GetJobId(), ref.GetAttempt(), ref.GetRank()}
	n := int64(proto.Size(first))
	var (
		now *outerAnswer
		sp  intakeSpec
	)
	err = s.do(ctx, func() error {
		rt, _, err := s.leaseFor(ref, p, true)
		if err != nil {
			return err
		}
		if now, sp, err = s.outerOpen(rt, st); err != nil {
			return err
		}
		if now != nil {
			s.countSync(rt, n, 0)
			return nil
		}
		return s.openStream("outer sync", key)
	})
	if err != nil {
		return err
	}
	if now == nil {
		defer s.closeStream(key)
		if now, err = s.outerIntake(stream, p, key, st, sp, n); err != nil {
			return err
		}
	}
	var out int64
	send := func(m *pb.OuterSyncResponse) error {
		out += int64(proto.Size(m))
		return stream.Send(m)
	}
	err = send(&pb.OuterSyncResponse{Part: &pb.OuterSyncResponse_Result{Result: &pb.OuterSyncResult{
		OuterStep: now.step, Done: now.done, Late: now.late}}})
	if err == nil {
		err = wire.SendSyncFloats(now.params, func(c *pb.SyncChunk) error {
			return send(&pb.OuterSyncResponse{Part: &pb.OuterSyncResponse_Chunk{Chunk: c}})
		})
	}
	_ = s.do(ctx, func() error {
		if rt := s.jobs[ref.GetJobId()]; rt != nil {
			s.countSync(rt, 0, out)
		}
		return nil
	})
	return err
}

// outerIntake takes an island's pseudo-gradient from its stream, hands it
// to the loop and waits for its answer.
func (s *Service) outerIntake(stream apiv1.PoolWorkerService_OuterSyncServer, p identity.Principal, key rankAttempt, st *pb.OuterSyncStart, sp intakeSpec, n int64) (*outerAnswer, error) {
	ctx := stream.Context()
	in, err := newIntake(sp)
	if err != nil {
		return nil, err
	}
	defer in.discard()
	err = receive(in, func() (*pb.SyncChunk, int, error) {
		m, err := stream.Recv()
		return m.GetChunk(), proto.Size(m), err
	}, &n)
	if err != nil {
		return nil, err
	}
	sum, norm, err := in.finish()
	if err != nil {
		return nil, err
	}
	c := contribution{spooled: spooled{path: in.path, size: sp.size, sum: sum, weight: sp.weight}, norm: norm}
	var rep outerReply
	err = s.do(ctx, func() error {
		s.intakeDone(key)
		rt, _, err := s.leaseFor(st.GetRef(), p, true)
		if err != nil {
			return err
		}
		if rep, err = s.outerContribute(rt, st, c); err != nil {
			return err
		}
		if rep.took {
			in.keep()
		}
		s.countSync(rt, n, 0)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if rep.now != nil {
		return rep.now, nil
	}
	r := rep.wait
	select {
	case <-r.done:
	case <-ctx.Done():
		return nil, errorf(codes.Canceled, "outer sync: %v", ctx.Err())
	case <-s.stop:
		return nil, errorf(codes.Unavailable, "pool service shutting down")
	}
	if r.err != nil {
		return nil, r.err
	}
	a := r.resp
	a.late = a.late || rep.late
	return &a, nil
}

// countSync adds synchronisation bytes to a job and, for an island, to its
// DiLoCo job. They are saved with the job's next change.
func (s *Service) countSync(rt *jobRT, in, out int64) {
	rt.rec.SyncBytesReceived += in
	rt.rec.SyncBytesSent += out
	if p := s.parentOf(rt); p != nil {
		p.rec.SyncBytesReceived += in
		p.rec.SyncBytesSent += out
	}
}
