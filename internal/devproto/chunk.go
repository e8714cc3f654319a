package devproto

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/internal/clock"
	"github.com/fleetlearn/fleetlearn/internal/tracing"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
)

// chunkSize is the data per chunk for a device configured with chunkBytes
// (see Config.ChunkBytes): 0 when reports are never chunked.
func chunkSize(js jetstream.JetStream, chunkBytes int) int {
	switch {
	case chunkBytes < 0:
		return 0
	case chunkBytes > 0:
		return chunkBytes
	}
	limit := int64(wire.MaxMessageBytes)
	// Before the first connect the client does not know the server's limit.
	if nc := js.Conn(); nc != nil && nc.MaxPayload() > 0 {
		limit = nc.MaxPayload()
	}
	return int(max(limit-wire.ChunkOverhead, wire.MinChunkBytes))
}

// publishChunked stores payload as ReportChunks on the device's chunk
// subject, each under a message id of its own, then a ReportManifest under
// the report's id on the report subject. A retry (of a chunk, or of the
// whole report after a reconnect) re-sends chunks the stream then drops as
// duplicates, acknowledging them with the first copy's sequence, so the
// manifest always names stored chunks. The stream holds at most one
// manifest per report id: a later attempt with other bytes leaves only
// orphan chunks, purged with the round.
func publishChunked(ctx context.Context, clk clock.Clock, js jetstream.JetStream, plan *pb.RoundPlan, device, reportID string,
	payload []byte, size int, jitter func(time.Duration) time.Duration) error {
	count := (len(payload) + size - 1) / size
	if count > wire.MaxReportChunks {
		return fmt.Errorf("publish report: %w: %d bytes in %d chunks of %d, at most %d chunks", ErrTooLarge,
			len(payload), count, size, wire.MaxReportChunks)
	}
	sum := wire.SHA256(payload)
	man := &pb.ReportManifest{Count: uint32(count), TotalSize: uint64(len(payload)), PayloadSha256: sum,
		ChunkSize: uint64(size), Sequences: make([]uint64, count)}
	subj := wire.ChunkSubject(plan.TaskId, plan.Round, device)
	for i := range count {
		data := payload[i*size : min(len(payload), (i+1)*size)]
		b, err := proto.Marshal(&pb.ReportChunk{Index: uint32(i), Count: uint32(count), TotalSize: uint64(len(payload)),
			PayloadSha256: sum, Data: data})
		if err != nil {
			return Permanent(fmt.Errorf("publish report: chunk %d: %w", i, err))
		}
		ack, err := publishMsg(ctx, clk, js, &nats.Msg{Subject: subj, Data: b, Header: tracing.Header(ctx)}, wire.ChunkMsgID(reportID, sum, i), jitter)
		if err != nil {
			if errors.Is(err, ErrTooLarge) {
				return fmt.Errorf("publish report: %d bytes: chunk %d of %d bytes: %w", len(payload), i, len(b), err)
			}
			return fmt.Errorf("publish report: chunk %d of %d: %w", i, count, err)
		}
		man.Sequences[i] = ack.Sequence
	}
	b, err := proto.Marshal(man)
	if err != nil {
		return Permanent(fmt.Errorf("publish report: manifest: %w", err))
	}
	rsubj, _, err := reportSubject(plan, device)
	if err != nil {
		return err
	}
	h := tracing.Header(ctx)
	if h == nil {
		h = nats.Header{}
	}
	h.Set(wire.HeaderChunked, wire.ChunkedV1)
	m := &nats.Msg{Subject: rsubj, Data: b, Header: h}
	if _, err := publishMsg(ctx, clk, js, m, reportID, jitter); err != nil {
		return fmt.Errorf("publish report: manifest of %d chunks: %w", count, err)
	}
	return nil
}
