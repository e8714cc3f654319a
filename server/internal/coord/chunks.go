package coord

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/round"
	"github.com/fleetlearn/fleetlearn/server/internal/metrics"
)

// Chunked reports (docs/PROTOCOL.md, Chunked reports). The round's consumer
// reads only report subjects, so a chunked report reaches the round loop as
// its small ReportManifest; the loop then reads the chunks the manifest
// names, one at a time by stream sequence, into one buffer of the round
// (roundRun.chunked), checks them and the whole report's sha256, and hands
// the reassembled report to the same checks a one-message report gets.
// Reports are handled one after another, so the server holds at most one
// reassembled report at a time, never more than the round's model admits.

const (
	// reportOverhead is what a report may add to its update's values:
	// ids, hashes, signature, metrics and the tensor layout.
	reportOverhead = 1 << 20
	// tensorOverhead bounds one tensor's entry in a report's layout.
	tensorOverhead = 1 << 10
	// chunkRead bounds one read of a chunk from the stream.
	chunkRead = 10 * time.Second
)

// assembled is a manifest's message with the report it stands for.
type assembled struct {
	jetstream.Msg
	data []byte
}

func (a assembled) Data() []byte { return a.data }

// settleChunked is settle for a report that may be chunked: accept gets the
// whole report either way, and a chunked one that cannot be reassembled is
// refused with the reason.
func (t *taskRun) settleChunked(r *roundRun, m jetstream.Msg, kind string, accept func(jetstream.Msg) (string, error)) {
	if _, chunked := m.Headers()[wire.HeaderChunked]; !chunked {
		t.settle(r, m, kind, func() (string, error) { return accept(m) })
		return
	}
	t.settle(r, m, kind, func() (string, error) {
		// Only a cohort device that has not reported gets its chunks read
		// (settleChunked serves evaluation reports only).
		device, _, _, err := t.sender(r, m.Subject(), round.Evaluate)
		if err != nil {
			return device, err
		}
		whole, err := t.reassemble(r, device, m)
		if err != nil {
			return device, err
		}
		t.c.d.Metrics.ReportBytes.Add(float64(len(whole.Data())))
		return accept(whole)
	})
}

// maxReportBytes is the largest report the round's model admits: an update
// of float32 values (or fixed32 masked values, with the weight or the DP
// encoding's padding) and bounded overhead. An evaluation report carries
// metrics only, so it never needs more than one message.
func (t *taskRun) maxReportBytes(r *roundRun) uint64 { return t.maxReportBytesFor(r.row.Kind) }

// maxReportBytesFor is maxReportBytes for a round of kind.
func (t *taskRun) maxReportBytesFor(kind pb.RoundKind) uint64 {
	if kind != pb.RoundKind_ROUND_KIND_TRAIN {
		return wire.MaxMessageBytes
	}
	layout := t.ulayout
	dim := layout.Size() + 1
	if t.dp != nil && t.dp.dist != nil {
		dim = max(dim, t.dp.dist.PaddedDim())
	}
	return 4*uint64(dim) + reportOverhead + tensorOverhead*uint64(len(layout.Entries))
}

// reassemble reads and checks the chunks m's manifest names and returns the
// report they make up (assembleReport holds the checks).
func (t *taskRun) reassemble(r *roundRun, device string, m jetstream.Msg) (_ jetstream.Msg, err error) {
	defer classify(&err, metrics.RefusedChunks)
	if err := checkChunkedHeader(m); err != nil {
		return nil, err
	}
	buf, err := assembleReport(m.Data(), t.maxReportBytes(r), t.id, r.row.Round, device, t.readStored, r.chunked)
	r.chunked = buf
	if err != nil {
		return nil, err
	}
	return assembled{Msg: m, data: buf}, nil
}

// checkChunkedHeader checks the chunked report header's version.
func checkChunkedHeader(m reportMsg) error {
	if v := m.Headers().Get(wire.HeaderChunked); v != wire.ChunkedV1 {
		return refuse("chunked report: unknown %s %q (want %q)", wire.HeaderChunked, v, wire.ChunkedV1)
	}
	return nil
}

// readStored is the chunkReader of the reports stream.
func (t *taskRun) readStored(seq uint64) (string, []byte, error) {
	raw, err := t.readChunk(seq)
	if err != nil {
		return "", nil, err
	}
	return raw.Subject, raw.Data, nil
}

// readChunk reads one message of the reports stream by sequence.
func (t *taskRun) readChunk(seq uint64) (*jetstream.RawStreamMsg, error) {
	ctx, cancel := context.WithTimeout(t.c.ctx, chunkRead)
	defer cancel()
	return t.c.d.Stream.GetMsg(ctx, seq)
}

// handleStoredChunk drops a chunk stored for a round that is not open;
// those of the open round are charged to their device's quota (quota.go)
// and wait for their manifest, and are purged with the round.
func (c *Coordinator) handleStoredChunk(subj string, h nats.Header) {
	task, round, device, err := wire.ParseChunkSubject(subj)
	if err == nil {
		c.mu.Lock()
		tr := c.tasks[task]
		c.mu.Unlock()
		if tr != nil && tr.isOpen(round) {
			c.charge(tr, subj, round, device, h)
			return
		}
	}
	c.d.Log.Debug("chunk for no open round dropped", "subject", subj, "device", device, "err", err)
	c.purgeStored(subj, 0)
}
