package devproto_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/internal/clock"
	"github.com/fleetlearn/fleetlearn/internal/devproto"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
)

// TestChunkedPublish: a report over the connection's max payload (64 KiB
// here) is stored as chunks on the device's chunk subject and a manifest on
// its report subject; the chunks the manifest names make up the report. A
// second publish of the same report (a retry) stores nothing new.
func TestChunkedPublish(t *testing.T) {
	f := newFixture(t)
	st, err := f.srvJS.CreateOrUpdateStream(context.Background(), jetstream.StreamConfig{Name: wire.StreamReports,
		Subjects: wire.StreamSubjects, MaxMsgSize: 128 << 10, Duplicates: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	plan := f.plan("t-1", 4, time.Hour).GetPlan()
	payload := make([]byte, 300<<10)
	rand.Read(payload)
	for range 2 {
		if err := devproto.PublishReport(t.Context(), clock.Real(), f.js, plan, "dev-1", payload, nil); err != nil {
			t.Fatal(err)
		}
	}
	info, err := st.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	size := int(f.nc.MaxPayload()) - wire.ChunkOverhead
	count := (len(payload) + size - 1) / size
	if info.State.Msgs != uint64(count+1) {
		t.Fatalf("stream holds %d messages, want %d chunks and a manifest", info.State.Msgs, count)
	}
	m, err := st.GetLastMsgForSubject(t.Context(), wire.ReportSubject("t-1", 4, "dev-1"))
	if err != nil {
		t.Fatal(err)
	}
	if m.Header.Get(wire.HeaderChunked) != wire.ChunkedV1 {
		t.Fatalf("manifest headers %v", m.Header)
	}
	var man pb.ReportManifest
	if err := proto.Unmarshal(m.Data, &man); err != nil {
		t.Fatal(err)
	}
	if int(man.Count) != count || man.TotalSize != uint64(len(payload)) || man.ChunkSize != uint64(size) ||
		man.PayloadSha256 != wire.SHA256(payload) || len(man.Sequences) != count {
		t.Fatalf("manifest %v", &man)
	}
	var got []byte
	for i, seq := range man.Sequences {
		raw, err := st.GetMsg(t.Context(), seq)
		if err != nil {
			t.Fatal(err)
		}
		var c pb.ReportChunk
		if err := proto.Unmarshal(raw.Data, &c); err != nil {
			t.Fatal(err)
		}
		if raw.Subject != wire.ChunkSubject("t-1", 4, "dev-1") || int(c.Index) != i || c.PayloadSha256 != man.PayloadSha256 {
			t.Fatalf("chunk %d on %s: index %d, sha256 %s", i, raw.Subject, c.Index, c.PayloadSha256)
		}
		got = append(got, c.Data...)
	}
	if !bytes.Equal(got, payload) {
		t.Fatal("chunks do not make up the report")
	}
	// A device whose chunks would be over the limit fails at once.
	big := make([]byte, wire.MaxReportChunks*(64<<10)+1)
	if err := devproto.PublishReport(t.Context(), clock.Real(), f.js, plan, "dev-2", big, nil); err == nil ||
		!bytes.Contains([]byte(err.Error()), []byte("too large")) {
		t.Fatalf("publish of %d bytes: %v", len(big), err)
	}
}
