package remote

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"

	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/aggregator/quant"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
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
	case cfg.Dim > maxParams:
		return nil, fmt.Errorf("remote: new outer syncer: %d parameters, limit %d: %w", cfg.Dim, maxParams, ErrTooLarge)
	case cfg.Island > maxIsland:
		return nil, fmt.Errorf("remote: new outer syncer: %w: island %d over %d", ErrInvalid, cfg.Island, maxIsland)
	}
	return &OuterSyncer{c: c, ref: proto.Clone(ref).(*pb.RankRef), cfg: cfg}, nil
}

// Join implements trainer.OuterSyncer: an OuterSync with no
// pseudo-gradient, which the server answers at once.
func (o *OuterSyncer) Join(ctx context.Context) (trainer.OuterState, error) {
	s, err := o.call(ctx, &pb.OuterSyncRequest{Ref: o.ref})
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
	enc, err := o.encode(step, pseudoGradient)
	if err != nil {
		return trainer.OuterState{}, fmt.Errorf("remote: outer sync step %d: %w", step, err)
	}
	// Built once: every retry sends the same bytes, so the server can
	// recognise a contribution it already took.
	req := &pb.OuterSyncRequest{Ref: o.ref, OuterStep: step, PseudoGradient: enc, Weight: weight}
	s, err := o.call(ctx, req)
	if err != nil {
		return trainer.OuterState{}, fmt.Errorf("remote: outer sync step %d: %w", step, err)
	}
	return s, nil
}

// encode is pg as little-endian float32, or with Int8 its FLQ8 encoding
// rounded with the source of (Seed, Island, step).
func (o *OuterSyncer) encode(step int64, pg []float32) ([]byte, error) {
	if !o.cfg.Int8 {
		return f32Bytes(pg), nil
	}
	src := rand.NewPCG(o.cfg.Seed, uint64(o.cfg.Island)<<48|uint64(step))
	q, err := quant.Quantize(pg, quant.DefaultBlock, src)
	if err != nil {
		return nil, fmt.Errorf("%w: int8 pseudo-gradient: %w", ErrInvalid, err)
	}
	return q.MarshalBinary()
}

func f32Bytes(v []float32) []byte {
	buf := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(x))
	}
	return buf
}

func (o *OuterSyncer) call(ctx context.Context, req *pb.OuterSyncRequest) (trainer.OuterState, error) {
	var r *pb.OuterSyncResponse
	err := o.cfg.Retry.Do(ctx, func(ctx context.Context) error {
		var err error
		r, err = o.c.OuterSync(ctx, req, CallOptions()...)
		return err
	})
	if err != nil {
		return trainer.OuterState{}, err
	}
	step, raw := r.GetOuterStep(), r.GetParams()
	if step < 0 || step >= maxOuterStep {
		return trainer.OuterState{}, fmt.Errorf("server sent outer step %d: %w", step, ErrBadResponse)
	}
	if len(raw) != 4*o.cfg.Dim {
		return trainer.OuterState{}, fmt.Errorf("server sent %d bytes of parameters for %d parameters: %w", len(raw), o.cfg.Dim, ErrBadResponse)
	}
	params := make([]float32, o.cfg.Dim)
	for i := range params {
		v := math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return trainer.OuterState{}, fmt.Errorf("server sent parameter %d = %v: %w", i, v, ErrBadResponse)
		}
		params[i] = v
	}
	return trainer.OuterState{Step: step, Params: params, Done: r.GetDone(), Late: r.GetLate()}, nil
}
