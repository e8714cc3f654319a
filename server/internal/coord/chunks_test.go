package coord

import (
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
)

// Chunked reports at the coordinator: a hostile device's chunks and
// manifests against honest reports (docs/SECURITY.md, chunked reports).

const testChunk = wire.MinChunkBytes

// paddedUpdate is the device's signed update for plan, marshalled with an
// unknown field of pad bytes, which the server's decoding skips: a valid
// report of about pad bytes, for chunking a tiny model's update.
func (d *device) paddedUpdate(plan *pb.RoundPlan, pad int) []byte {
	d.h.t.Helper()
	b, err := proto.Marshal(d.signedUpdate(plan, constant(8, 0.1), 5, nil))
	if err != nil {
		d.h.t.Fatal(err)
	}
	b = protowire.AppendTag(b, 9999, protowire.BytesType)
	return protowire.AppendBytes(b, make([]byte, pad))
}

// chunks cuts payload into ReportChunks of testChunk bytes.
func chunks(payload []byte) []*pb.ReportChunk {
	sum := wire.SHA256(payload)
	n := (len(payload) + testChunk - 1) / testChunk
	out := make([]*pb.ReportChunk, n)
	for i := range out {
		out[i] = &pb.ReportChunk{Index: uint32(i), Count: uint32(n), TotalSize: uint64(len(payload)), PayloadSha256: sum,
			Data: payload[i*testChunk : min(len(payload), (i+1)*testChunk)]}
	}
	return out
}

// storeChunk stores c on device's chunk subject of plan under msgID and
// returns its stream sequence.
func (d *device) storeChunk(plan *pb.RoundPlan, device string, c *pb.ReportChunk, msgID string) uint64 {
	d.h.t.Helper()
	b, err := proto.Marshal(c)
	if err != nil {
		d.h.t.Fatal(err)
	}
	ack, err := d.h.js.Publish(d.h.t.Context(), wire.ChunkSubject(plan.TaskId, plan.Round, device), b, jetstream.WithMsgID(msgID))
	if err != nil {
		d.h.t.Fatal(err)
	}
	return ack.Sequence
}

// storeAll stores cs as the device's chunks and returns the manifest.
func (d *device) storeAll(plan *pb.RoundPlan, cs []*pb.ReportChunk) *pb.ReportManifest {
	d.h.t.Helper()
	man := &pb.ReportManifest{Count: cs[0].Count, TotalSize: cs[0].TotalSize, PayloadSha256: cs[0].PayloadSha256,
		ChunkSize: testChunk}
	id := wire.MsgID("update", plan.TaskId, plan.Round, d.id)
	for i, c := range cs {
		man.Sequences = append(man.Sequences, d.storeChunk(plan, d.id, c, wire.ChunkMsgID(id, c.PayloadSha256, i)))
	}
	return man
}

// sendManifest stores man as the device's report for plan.
func (d *device) sendManifest(plan *pb.RoundPlan, man *pb.ReportManifest) {
	d.h.t.Helper()
	b, err := proto.Marshal(man)
	if err != nil {
		d.h.t.Fatal(err)
	}
	m := &nats.Msg{Subject: wire.ReportSubject(plan.TaskId, plan.Round, d.id), Data: b,
		Header: nats.Header{wire.HeaderChunked: []string{wire.ChunkedV1}}}
	if _, err := d.h.js.PublishMsg(d.h.t.Context(), m, jetstream.WithMsgID(wire.MsgID("update", plan.TaskId, plan.Round, d.id))); err != nil {
		d.h.t.Fatal(err)
	}
}

// TestChunkedReports: chunked reports from honest devices count, one with
// replayed chunks among them; each attack on the chunks refuses only its
// device's report, with the reason.
func TestChunkedReports(t *testing.T) {
	h := newHarness(t)
	task := h.start(h.baseTask(func(task *pb.Task) { task.CohortTarget, task.ReportGoal = 8, 2 }))
	ev := h.watch(task.Id)
	a, b := h.enroll("dev-a", 5), h.enroll("dev-b", 5)
	pa, pb_ := a.join(), b.join()

	// dev-a: three chunks, each stored twice (the same id: dropped by the
	// stream; another id: a second copy the manifest does not name), chunk
	// 0 once more after the others.
	cs := chunks(a.paddedUpdate(pa, 2*testChunk+100))
	if len(cs) != 3 {
		t.Fatalf("%d chunks", len(cs))
	}
	man := a.storeAll(pa, cs)
	id := wire.MsgID("update", pa.TaskId, pa.Round, a.id)
	for i, c := range cs {
		if seq := a.storeChunk(pa, a.id, c, wire.ChunkMsgID(id, c.PayloadSha256, i)); seq != man.Sequences[i] {
			t.Fatalf("retried chunk %d stored at %d, first copy at %d", i, seq, man.Sequences[i])
		}
		a.storeChunk(pa, a.id, c, "replay-"+wire.ChunkMsgID(id, c.PayloadSha256, i))
	}
	a.sendManifest(pa, man)
	if r := a.receipt(); !r.Accepted {
		t.Fatalf("chunked report with replayed chunks: %v", r)
	}

	attacks := []struct {
		name string
		edit func(d *device, plan *pb.RoundPlan) *pb.ReportManifest
		want string
	}{
		{"wrong hash", func(d *device, plan *pb.RoundPlan) *pb.ReportManifest {
			cs := chunks(d.paddedUpdate(plan, testChunk+10))
			cs[1].Data = append([]byte(nil), cs[1].Data...)
			cs[1].Data[7] ^= 1
			return d.storeAll(plan, cs)
		}, "does not match the manifest"},
		{"missing chunk", func(d *device, plan *pb.RoundPlan) *pb.ReportManifest {
			man := d.storeAll(plan, chunks(d.paddedUpdate(plan, testChunk+10)))
			man.Sequences[1] = 1 << 40
			return man
		}, "chunk 1 (stream sequence 1099511627776) is missing"},
		{"oversized total", func(d *device, plan *pb.RoundPlan) *pb.ReportManifest {
			man := d.storeAll(plan, chunks(d.paddedUpdate(plan, testChunk+10)))
			man.TotalSize, man.Count = 4<<20, 64
			man.Sequences = make([]uint64, 64)
			return man
		}, "4194304 bytes, this round admits"},
		{"another device's chunk", func(d *device, plan *pb.RoundPlan) *pb.ReportManifest {
			// The server's open connection can publish for dev-a; a
			// device's NATS permissions would refuse it (natsembed tests).
			cs := chunks(d.paddedUpdate(plan, testChunk+10))
			man := d.storeAll(plan, cs)
			// dev-b has not reported: chunks after a manifest would be
			// deleted as orphans of a retry (quota.go).
			man.Sequences[0] = d.storeChunk(plan, "dev-b", cs[0], "forged")
			return man
		}, "is not a chunk of device"},
		{"chunk of another report", func(d *device, plan *pb.RoundPlan) *pb.ReportManifest {
			// The earlier report's chunks are purged as an abandoned
			// attempt once the later one's arrive (quota.go), if the
			// manifest is not read first: either way chunk 1 is refused.
			other := d.storeAll(plan, chunks(d.paddedUpdate(plan, testChunk+20)))
			man := d.storeAll(plan, chunks(d.paddedUpdate(plan, testChunk+10)))
			man.Sequences[1] = other.Sequences[1]
			return man
		}, "chunk 1"},
		{"too many chunks", func(d *device, plan *pb.RoundPlan) *pb.ReportManifest {
			return &pb.ReportManifest{Count: wire.MaxReportChunks + 1, TotalSize: 1000, ChunkSize: 1,
				PayloadSha256: wire.SHA256(nil), Sequences: make([]uint64, wire.MaxReportChunks+1)}
		}, "chunks, at most"},
	}
	for i, at := range attacks {
		d := h.enroll(fmt.Sprintf("mallory-%d", i), 5)
		plan := d.join()
		d.sendManifest(plan, at.edit(d, plan))
		if r := d.receipt(); r.Accepted || !containsAll(r.Reason, at.want) {
			t.Errorf("%s: receipt %v, want refused with %q", at.name, r, at.want)
		}
	}

	// dev-b's report is one chunk (any size is allowed for a single chunk).
	cb := chunks(b.paddedUpdate(pb_, 10))
	cb[0].Count = 1
	man = b.storeAll(pb_, cb[:1])
	man.ChunkSize = man.TotalSize
	b.sendManifest(pb_, man)
	if r := b.receipt(); !r.Accepted {
		t.Fatalf("one-chunk report: %v", r)
	}
	h.clk.Advance(30 * 1e9)
	if got := h.next(ev); got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED || got.Reported != 2 {
		t.Fatalf("round: %v", got)
	}
}
