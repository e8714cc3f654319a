package remote

import (
	"context"
	"fmt"

	"google.golang.org/protobuf/proto"

	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
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

// Average implements trainer.Syncer. It streams params to the server in
// chunks and blocks until every rank has contributed for step, as the
// server's Average does; the mean streams back into a new slice.
func (s *Syncer) Average(ctx context.Context, step int64, params []float32, weight float64) ([]float32, error) {
	switch {
	case len(params) == 0:
		return nil, fmt.Errorf("remote: average step %d: %w: no parameters", step, ErrInvalid)
	case len(params) > MaxSyncParams:
		return nil, fmt.Errorf("remote: average step %d: %d parameters, limit %d: %w", step, len(params), MaxSyncParams, ErrTooLarge)
	}
	start := &pb.AverageRequest{Part: &pb.AverageRequest_Start{Start: &pb.AverageStart{Ref: s.ref, Step: step, Weight: weight,
		Size: 4 * int64(len(params))}}}
	avg := make([]float32, len(params))
	err := s.retry.Do(ctx, func(ctx context.Context) error {
		// Cancelled on return: a stream left behind by an error ends.
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		st, err := s.c.Average(ctx, CallOptions()...)
		if err != nil {
			return err
		}
		err = st.Send(start)
		if err == nil {
			err = wire.SendSyncFloats(params, func(c *pb.SyncChunk) error {
				return st.Send(&pb.AverageRequest{Part: &pb.AverageRequest_Chunk{Chunk: c}})
			})
		}
		if err := sent(err, st.CloseSend); err != nil {
			return err
		}
		return receiveFloats(avg, func() (*pb.SyncChunk, error) {
			m, err := st.Recv()
			return m.GetChunk(), err
		})
	})
	if err != nil {
		return nil, fmt.Errorf("remote: average step %d: %w", step, err)
	}
	return avg, nil
}
