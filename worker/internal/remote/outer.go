package remote

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"

	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/aggregator/quant"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/worker/internal/trainer"
)

// maxOuterStep bounds the outer steps named in requests and accepted in
// answers; below 2⁴⁸ the int8 rounding seed keeps island and step apart.
const maxOuterStep = 1 << 48

// maxIsland bounds the island index, as the seed gives it 16 bits.
const maxIsland = 1<<16 - 1

// OuterConfig describes a DiLoCo island's link to the server.
type OuterConfig struct {
	// Dim is the model's parameter count: answers of any other length are
	// refused.
	Dim int
	// Int8 sends pseudo-gradients as FLQ8 (package quant) instead of
	// float32, as the job's spec.diloco.int8 asks.
	Int8 bool
	// Seed and Island seed the int8 stochastic rounding of each outer
	// step, so that an island restarted at the same step sends the same
	// bytes; Seed is the job's built-in trainer seed.
	Seed   uint64
	Island uint32
	Retry  Retry
}

// OuterSyncer is a DiLoCo island's trainer.OuterSyncer over the server's
// OuterSync call.
type OuterSyncer struct {
	c   apiv1.PoolWorkerServiceClient
	ref *pb.RankRef
	cfg OuterConfig
}

var _ trainer.OuterSyncer = (*OuterSyncer)(nil)

// NewOuterSyncer returns the OuterSyncer of the island whose rank ref
// names.
func NewOuterSyncer(c apiv1.PoolWorkerServiceClient, ref *pb.RankRef, cfg OuterConfig) (*OuterSyncer, error) {
	if err := checkRef(c, ref); err != nil {
		return nil, fmt.Errorf("remote: new outer syncer: %w", err)
	}
	switch {
	case cfg.Dim < 1:
		return nil, fmt.Errorf("remote: new outer syncer: %w: %d parameters", ErrInvalid, cfg.Dim)
	case cfg.Dim > MaxSyncParams:
		return nil, fmt.Errorf("remote: new outer syncer: %d parameters, limit %d: %w", cfg.Dim, MaxSyncParams, ErrTooLarge)
	case cfg.Island > maxIsland:
		return nil, fmt.Errorf("remote: new outer syncer: %w: island %d over %d", ErrInvalid, cfg.Island, maxIsland)
	}
	return &OuterSyncer{c: c, ref: proto.Clone(ref).(*pb.RankRef), cfg: cfg}, nil
}

// Join implements trainer.OuterSyncer: an OuterSync with no
// pseudo-gradient, which the server answers at once.
func (o *OuterSyncer) Join(ctx context.Context) (trainer.OuterState, error) {
	s, err := o.call(ctx, &pb.OuterSyncStart{Ref: o.ref}, nil)
	if err != nil {
		return trainer.OuterState{}, fmt.Errorf("remote: outer join: %w", err)
	}
	return s, nil
}

// Contribute implements trainer.OuterSyncer. It blocks until the server
// closes outer step step, with or without this contribution.
func (o *OuterSyncer) Contribute(ctx context.Context, step int64, pseudoGradient []float32, weight float64) (trainer.OuterState, error) {
	switch {
	case step < 0 || step >= maxOuterStep:
		return trainer.OuterState{}, fmt.Errorf("remote: outer sync step %d: %w: step not in [0, %d)", step, ErrInvalid, int64(maxOuterStep))
	case len(pseudoGradient) != o.cfg.Dim:
		return trainer.OuterState{}, fmt.Errorf("remote: outer sync step %d: %w: %d values for %d parameters", step, ErrInvalid, len(pseudoGradient), o.cfg.Dim)
	case !(weight > 0) || math.IsInf(weight, 0):
		return trainer.OuterState{}, fmt.Errorf("remote: outer sync step %d: %w: weight %v, want positive and finite", step, ErrInvalid, weight)
	}
	// Every retry sends the same bytes, so the server can recognise a
	// contribution it already took: float32 values as they are, int8
	// ones encoded once.
	start := &pb.OuterSyncStart{Ref: o.ref, OuterStep: step, Weight: weight, Size: 4 * int64(len(pseudoGradient))}
	body := func(send func(*pb.SyncChunk) error) error { return wire.SendSyncFloats(pseudoGradient, send) }
	if o.cfg.Int8 {
		enc, err := o.encode(step, pseudoGradient)
		if err != nil {
			return trainer.OuterState{}, fmt.Errorf("remote: outer sync step %d: %w", step, err)
		}
		start.Size = int64(len(enc))
		body = func(send func(*pb.SyncChunk) error) error { return wire.SendSyncBytes(enc, send) }
	}
	s, err := o.call(ctx, start, body)
	if err != nil {
		return trainer.OuterState{}, fmt.Errorf("remote: outer sync step %d: %w", step, err)
	}
	return s, nil
}

// encode is pg's FLQ8 encoding rounded with the source of (Seed, Island,
// step).
func (o *OuterSyncer) encode(step int64, pg []float32) ([]byte, error) {
	src := rand.NewPCG(o.cfg.Seed, uint64(o.cfg.Island)<<48|uint64(step))
	q, err := quant.Quantize(pg, quant.DefaultBlock, src)
	if err != nil {
		return nil, fmt.Errorf("%w: int8 pseudo-gradient: %w", ErrInvalid, err)
	}
	return q.MarshalBinary()
}

// call runs one OuterSync stream, retried whole while the server is
// unavailable: start, then body's chunks (nil: a join), then the answer.
func (o *OuterSyncer) call(ctx context.Context, start *pb.OuterSyncStart, body func(func(*pb.SyncChunk) error) error) (trainer.OuterState, error) {
	params := make([]float32, o.cfg.Dim)
	var res *pb.OuterSyncResult
	err := o.cfg.Retry.Do(ctx, func(ctx context.Context) error {
		// Cancelled on return: a stream left behind by an error ends.
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		st, err := o.c.OuterSync(ctx, CallOptions()...)
		if err != nil {
			return err
		}
		err = st.Send(&pb.OuterSyncRequest{Part: &pb.OuterSyncRequest_Start{Start: start}})
		if err == nil && body != nil {
			err = body(func(c *pb.SyncChunk) error {
				return st.Send(&pb.OuterSyncRequest{Part: &pb.OuterSyncRequest_Chunk{Chunk: c}})
			})
		}
		if err := sent(err, st.CloseSend); err != nil {
			return err
		}
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("server ended the call without a result: %w", ErrBadResponse)
		}
		if err != nil {
			return err
		}
		if res = m.GetResult(); res == nil {
			return fmt.Errorf("server answered with parameters before the result: %w", ErrBadResponse)
		}
		return receiveFloats(params, func() (*pb.SyncChunk, error) {
			m, err := st.Recv()
			return m.GetChunk(), err
		})
	})
	if err != nil {
		return trainer.OuterState{}, err
	}
	if step := res.GetOuterStep(); step < 0 || step >= maxOuterStep {
		return trainer.OuterState{}, fmt.Errorf("server sent outer step %d: %w", step, ErrBadResponse)
	}
	return trainer.OuterState{Step: res.GetOuterStep(), Params: params, Done: res.GetDone(), Late: res.GetLate()}, nil
}
