package poolsvc

import (
	"context"
	"encoding/binary"
	"math"
	"path/filepath"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
)

// syncRound is one open parameter average of an attempt.
type syncRound struct {
	step int64
	size int64 // bytes each rank sends
	// By rank: the checked contribution on disk, its digest (for
	// retries) and its weight; path "" until the rank has contributed.
	spools  []spooled
	weights []float64
	arrived int
	done    chan struct{}
	result  []float32
	err     error
}

func (r *syncRound) finish(res []float32, err error) {
	r.result, r.err = res, err
	close(r.done)
}

func (rt *jobRT) abortSync(why string) {
	if r := rt.sync; r != nil {
		rt.sync = nil
		removeSpools(r.spools)
		r.finish(nil, errorf(codes.Aborted, "average of job %s step %d abandoned: %s", rt.id(), r.step, why))
	}
}

func encodeParams(v []float32) []byte {
	out := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(x))
	}
	return out
}

// archParams is the parameter count of an MLP of widths arch.
func archParams(arch []uint32) int64 {
	var n int64
	for i := 1; i < len(arch); i++ {
		n += int64(arch[i-1])*int64(arch[i]) + int64(arch[i])
	}
	return n
}

// averageSize is the bytes each rank of rt sends to Average when the
// server knows the job's model: 4 per parameter of a built-in job's arch,
// or of the registered model it starts from. 0 when only the ranks know
// (a command job): they must then agree with each other, within
// averageLimit.
func (s *Service) averageSize(rt *jobRT) int64 {
	if rt.syncSize > 0 {
		return rt.syncSize
	}
	b := rt.rec.GetSpec().GetBuiltin()
	switch {
	case b == nil:
		return 0
	case b.GetInitModel() == "":
		rt.syncSize = 4 * archParams(b.GetArch())
	default:
		m, err := s.d.Store.Model(context.Background(), b.GetInitModel())
		if err != nil {
			// Bounded by averageLimit instead; asked again next time.
			s.log.Warn("reading the registered model a pool job starts from", "job", rt.id(), "model", b.GetInitModel(), "err", err)
			return 0
		}
		rt.syncSize = 4 * int64(m.Params)
	}
	return rt.syncSize
}

// averageLimit bounds an Average whose size the server cannot derive from
// the job's model: what a rank of the job may keep in checkpoints, at most
// the absolute ceiling.
func (s *Service) averageLimit(rt *jobRT) int64 {
	c, _ := s.storageCap(rt)
	return min(c, 4*MaxSyncParams)
}

// openAverage checks a rank's Average start against the job on the loop.
// It says whether the bytes are to be spooled: not when the stream can
// only be a retry of the rank's contribution to an average still held.
func (s *Service) openAverage(rt *jobRT, rank uint32, st *pb.AverageStart) (spool bool, err error) {
	step, size, weight := st.GetStep(), st.GetSize(), st.GetWeight()
	if step <= rt.rec.CommittedStep || step > rt.spec.TotalSteps {
		return false, invalidf("average: step %d outside (%d, %d]", step, rt.rec.CommittedStep, rt.spec.TotalSteps)
	}
	if want := s.averageSize(rt); want > 0 && size != want {
		return false, invalidf("average: %d bytes of parameters, but the job's model has %d parameters (%d bytes): send model.Flatten() as little-endian float32",
			size, want/4, want)
	} else if limit := s.averageLimit(rt); size > limit {
		return false, invalidf("average: %d bytes of parameters, at most %d for a rank of this job", size, limit)
	}
	if last, ok := rt.lastSync[rank]; ok && step <= last {
		for _, r := range []*syncRound{rt.sync, rt.synced} {
			if r != nil && r.step == step && step == last {
				return false, nil
			}
		}
		return false, invalidf("average: rank %d already contributed step %d; each step once, in increasing order", rank, last)
	}
	if w, ok := rt.weights[rank]; ok && w != weight {
		return false, invalidf("average: rank %d weight %v, but it was %v at its first sync; the weight is the shard's example count and cannot change", rank, weight, w)
	}
	if r := rt.sync; r != nil {
		if r.step != step {
			rt.abortSync("ranks disagree about the step")
			return false, invalidf("average: rank %d at step %d while step %d is open", rank, step, r.step)
		}
		if r.size != size {
			return false, invalidf("average: rank %d sends %d values, another rank sent %d", rank, size/4, r.size/4)
		}
	}
	return true, nil
}

// contribution is a finished intake.
type contribution struct {
	spooled
	norm float64
}

// contribute adds a rank's checked contribution to the attempt's open
// average; the loop calls it. took says the round holds the spool now. A
// rank out of step with the open average fails it for every rank, as
// ranks resumed from different checkpoints would.
func (s *Service) contribute(rt *jobRT, rank uint32, step int64, c contribution) (r *syncRound, took bool, err error) {
	if last, ok := rt.lastSync[rank]; ok && step <= last {
		// The same contribution again is a retry of a call whose answer
		// was lost (the worker retries on UNAVAILABLE): it joins, or gets
		// the result of, the average it is already part of.
		for _, r := range []*syncRound{rt.sync, rt.synced} {
			if r != nil && r.step == step && step == last && r.weights[rank] == c.weight && r.spools[rank].sum == c.sum {
				return r, false, nil
			}
		}
		return nil, false, invalidf("average: rank %d already contributed step %d; each step once, in increasing order", rank, last)
	}
	if c.path == "" {
		return nil, false, errorf(codes.Unavailable, "average: step %d changed while rank %d's contribution streamed; send it again", step, rank)
	}
	if w, ok := rt.weights[rank]; ok && w != c.weight {
		return nil, false, invalidf("average: rank %d weight %v, but it was %v at its first sync; the weight is the shard's example count and cannot change", rank, c.weight, w)
	}
	r = rt.sync
	if r != nil && r.step != step {
		rt.abortSync("ranks disagree about the step")
		return nil, false, invalidf("average: rank %d at step %d while step %d is open", rank, step, r.step)
	}
	if r == nil {
		world := len(rt.leases)
		r = &syncRound{step: step, size: c.size, spools: make([]spooled, world), weights: make([]float64, world), done: make(chan struct{})}
		rt.sync = r
	}
	if r.size != c.size {
		return nil, false, invalidf("average: rank %d sent %d values, another rank %d", rank, c.size/4, r.size/4)
	}
	r.spools[rank], r.weights[rank] = c.spooled, c.weight
	rt.weights[rank], rt.lastSync[rank] = c.weight, step
	if r.arrived++; r.arrived < len(r.spools) {
		return r, true, nil
	}
	rt.sync, rt.synced = nil, r
	go s.foldAverage(rt.id(), r)
	return r, true, nil
}

// foldAverage forms a full round's mean off the loop: the ranks' spools
// read back in rank order, so the float64 sums, and the result, do not
// depend on arrival order.
func (s *Service) foldAverage(job string, r *syncRound) {
	mean, err := foldSpools(int(r.size/4), false, r.spools, r.weights, s.stop)
	removeSpools(r.spools)
	if err != nil {
		s.log.Error("forming a pool average", "job", job, "step", r.step, "err", err)
		r.finish(nil, errorf(codes.Internal, "average of job %s step %d could not be formed: %v", job, r.step, err))
		return
	}
	r.finish(mean, nil)
}

// Average implements PoolWorkerService.Average.
func (v *workerServer) Average(stream apiv1.PoolWorkerService_AverageServer) error {
	s := v.s
	ctx := stream.Context()
	p, err := principal(ctx)
	if err != nil {
		return err
	}
	first, err := stream.Recv()
	if err != nil {
		return streamErr("average", err)
	}
	st := first.GetStart()
	if st == nil {
		return invalidf("average: the stream must open with start (ref, step, weight, size), then the parameters in chunks; a worker that sends them in one message predates streamed averages: upgrade it")
	}
	w, size := st.GetWeight(), st.GetSize()
	if math.IsNaN(w) || w < 1 || w > 1<<31 || w != math.Trunc(w) {
		return invalidf("average: weight %v: want the shard's example count, an integer in [1, 2^31]", w)
	}
	if size <= 0 || size%4 != 0 || size > 4*MaxSyncParams {
		return invalidf("average: size %d: want 4 bytes per parameter, at most %d parameters", size, MaxSyncParams)
	}
	ref := st.GetRef()
	rank, step := ref.GetRank(), st.GetStep()
	key := rankAttempt{ref.GetJobId(), ref.GetAttempt(), rank}
	sp := intakeSpec{op: "average: params", size: size, dim: int(size / 4), weight: w}
	err = s.do(ctx, func() error {
		rt, _, err := s.leaseFor(ref, p, false)
		if err != nil {
			return err
		}
		spool, err := s.openAverage(rt, rank, st)
		if err != nil {
			return err
		}
		if err := s.openStream("average", key); err != nil {
			return err
		}
		if spool {
			sp.spool = filepath.Join(s.spoolDir(), ref.GetJobId())
		}
		return nil
	})
	if err != nil {
		return err
	}
	defer s.closeStream(key)
	in, err := newIntake(sp)
	if err != nil {
		return err
	}
	defer in.discard()
	n := int64(proto.Size(first))
	err = receive(in, func() (*pb.SyncChunk, int, error) {
		m, err := stream.Recv()
		return m.GetChunk(), proto.Size(m), err
	}, &n)
	if err != nil {
		return err
	}
	sum, norm, err := in.finish()
	if err != nil {
		return err
	}
	c := contribution{spooled: spooled{path: in.path, size: size, sum: sum, weight: w}, norm: norm}
	var r *syncRound
	err = s.do(ctx, func() error {
		s.intakeDone(key)
		rt, _, err := s.leaseFor(ref, p, false)
		if err != nil {
			return err
		}
		var took bool
		if r, took, err = s.contribute(rt, rank, step, c); err != nil {
			return err
		}
		if took {
			in.keep()
		}
		s.countSync(rt, n, 0)
		return nil
	})
	if err != nil {
		return err
	}
	select {
	case <-r.done:
	case <-ctx.Done():
		return errorf(codes.Canceled, "average: %v", ctx.Err())
	case <-s.stop:
		return errorf(codes.Unavailable, "pool service shutting down")
	}
	if r.err != nil {
		return r.err
	}
	var out int64
	err = wire.SendSyncFloats(r.result, func(c *pb.SyncChunk) error {
		m := &pb.AverageResponse{Chunk: c}
		out += int64(proto.Size(m))
		return stream.Send(m)
	})
	_ = s.do(ctx, func() error {
		if rt := s.jobs[ref.GetJobId()]; rt != nil {
			s.countSync(rt, 0, out)
		}
		return nil
	})
	if err != nil && status.Code(err) == codes.Unknown {
		return errorf(codes.Canceled, "average: sending the mean: %v", err)
	}
	return err
}
