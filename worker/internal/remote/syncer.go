package remote

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"google.golang.org/protobuf/proto"

	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// Syncer averages one rank's parameters with the job's other ranks through
// the server (trainer.Syncer).
type Syncer struct {
	c     apiv1.PoolWorkerServiceClient
	ref   *pb.RankRef
	retry Retry
}

// NewSyncer returns the Syncer of the rank ref names.
func NewSyncer(c apiv1.PoolWorkerServiceClient, ref *pb.RankRef, r Retry) (*Syncer, error) {
	if err := checkRef(c, ref); err != nil {
		return nil, fmt.Errorf("remote: new syncer: %w", err)
	}
	return &Syncer{c: c, ref: proto.Clone(ref).(*pb.RankRef), retry: r}, nil
}

// maxParams keeps a request, and the answer of the same length, within the
// message limit with room for the envelope.
const maxParams = (MaxMessageBytes - 64<<10) / 4

// Average implements trainer.Syncer. It blocks until every rank has
// contributed for step, as the server's Average does.
func (s *Syncer) Average(ctx context.Context, step int64, params []float32, weight float64) ([]float32, error) {
	if len(params) > maxParams {
		return nil, fmt.Errorf("remote: average step %d: %d parameters, limit %d: %w", step, len(params), maxParams, ErrTooLarge)
	}
	buf := make([]byte, 4*len(params))
	for i, v := range params {
		binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(v))
	}
	req := &pb.AverageRequest{Ref: s.ref, Step: step, Params: buf, Weight: weight}
	var out []byte
	err := s.retry.Do(ctx, func(ctx context.Context) error {
		r, err := s.c.Average(ctx, req, CallOptions()...)
		out = r.GetParams()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("remote: average step %d: %w", step, err)
	}
	if len(out) != len(buf) {
		return nil, fmt.Errorf("remote: average step %d: server sent %d bytes for %d parameters: %w", step, len(out), len(params), ErrBadResponse)
	}
	avg := make([]float32, len(params))
	for i := range avg {
		v := math.Float32frombits(binary.LittleEndian.Uint32(out[4*i:]))
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return nil, fmt.Errorf("remote: average step %d: parameter %d is %v: %w", step, i, v, ErrBadResponse)
		}
		avg[i] = v
	}
	return avg, nil
}
