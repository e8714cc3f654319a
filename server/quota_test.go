package server_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/data/datatest"
	"github.com/fleetlearn/fleetlearn/edge"
	"github.com/fleetlearn/fleetlearn/internal/testwait"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/server/servertest"
)

// floodBytes is how much each flooding device stores in
// TestHostileChunkFlood: $FLEETLEARN_FLOOD_MIB MiB (docs/SECURITY.md
// measures 512), 48 MiB by default.
func floodBytes(t *testing.T) int {
	mib := 48
	if v := os.Getenv("FLEETLEARN_FLOOD_MIB"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("FLEETLEARN_FLOOD_MIB=%q: want a positive number of MiB", v)
		}
		mib = n
	}
	return mib << 20
}

// TestHostileChunkFlood: two enrolled devices store chunks as fast as the
// stream takes them in an open round: one holding a seat in it, one that
// never checked in. Their chunks carry forged Nats-Subject, Nats-Sequence
// and Nats-Msg-Size headers, as if they were small or someone else's. The
// reports stream never keeps more than a device's quota (the round's
// largest report plus framing) for each of them beyond what it held before,
// the seated flooder's report is refused with a receipt naming the quota,
// and the three honest agents' reports commit.
func TestHostileChunkFlood(t *testing.T) {
	h := servertest.New(t)
	spec, _ := softmaxTask(t, h, "flood", 1, 3, 4) // a fourth seat, for the flooder
	// The flood comes before the honest agents start: selection waits for them.
	spec.SelectionTimeout, spec.ReportTimeout = durationpb.New(10*time.Minute), durationpb.New(20*time.Minute)
	task := h.CreateTask(t, spec).Id

	ids := []string{"dev-0", "dev-1", "dev-2"}
	dirs := make([]string, len(ids))
	for i, id := range ids {
		dirs[i] = enrollDir(t, h, id)
	}
	seated, outsider := newScripted(t, h, "flood-in"), newScripted(t, h, "flood-out")
	waitRound(t, h, task, 1, 10*time.Second, pb.RoundState_ROUND_STATE_OPEN)
	seated.join(t, task, 1)

	js, err := jetstream.New(servertest.ServiceConn(t, h.Dir, h.NATSURL()))
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(t.Context(), wire.StreamReports)
	if err != nil {
		t.Fatal(err)
	}
	streamBytes := func() uint64 {
		info, err := stream.Info(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Bytes
	}
	base := streamBytes()
	// The round's quota per device: an update of the 8×3 model's 27 values
	// (and the weight), with the report's and the chunks' allowances
	// (server/internal/coord: reportOverhead, tensorOverhead, quotaFraming).
	const quota = 4*(27+1) + 1<<20 + 2<<10 + 1<<20

	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		peak uint64
	)
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			b := streamBytes()
			mu.Lock()
			peak = max(peak, b)
			mu.Unlock()
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()

	total := floodBytes(t)
	const chunk = 1 << 20
	payload := make([]byte, chunk)
	rand.Read(payload)
	flood := func(d *scripted, victim string) {
		subj := wire.ChunkSubject(task, 1, d.id)
		for i := range total / chunk {
			m := &nats.Msg{Subject: subj, Data: payload, Header: nats.Header{
				jetstream.SubjectHeader:  []string{wire.ChunkSubject(task, 1, victim)},
				jetstream.SequenceHeader: []string{"1"},
				"Nats-Msg-Size":          []string{"1"},
				jetstream.MsgIDHeader:    []string{fmt.Sprintf("flood/%064x/%d", 0, i)},
			}}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			_, err := d.js.PublishMsg(ctx, m)
			cancel()
			if err != nil {
				t.Errorf("%s: chunk %d: %v", d.id, i, err)
				return
			}
		}
	}
	start := time.Now()
	var fw sync.WaitGroup
	for _, d := range []*scripted{seated, outsider} {
		fw.Add(1)
		go func() { defer fw.Done(); flood(d, ids[0]) }()
	}
	fw.Wait()
	elapsed := time.Since(start)

	// The notices of the last chunks may still be on their way: what the
	// stream keeps settles within the quota.
	// Between a chunk's store and the server's purge, a device flooding as
	// fast as the stream stores may have one more chunk in flight.
	limit := base + 2*(quota+chunk)
	for end := time.Now().Add(testwait.Limit(t)); streamBytes() > base+quota; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the reports stream holds %d bytes after the flood, %d before; want at most %d more", streamBytes(), base, quota)
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("%d MiB stored by each of 2 devices in %v; the reports stream held %d bytes before, peaked at %d (+%d), holds %d after; quota %d per device",
		total>>20, elapsed.Round(time.Millisecond), base, peak, peak-base, streamBytes(), quota)
	if peak > limit {
		t.Errorf("the reports stream peaked at %d bytes, %d before the flood: more than the two flooders' quotas and a chunk in flight each (%d)", peak, base, limit-base)
	}

	if r := seated.receipt(t); r.Accepted || !strings.Contains(r.Reason, "stored more than the") {
		t.Errorf("seated flooder's receipt %v, want its reports refused for its quota", r)
	}
	var agents []*edge.Agent
	for i, id := range ids {
		agents = append(agents, startAgent(t, h, dirs[i], id, datatest.Synthetic(100+20*i, 8, 3, uint64(i+1))))
	}
	rounds := completed(t, h, task, time.Minute, 1)
	if r := rounds[0]; r.Reported != 3 || r.State != pb.RoundState_ROUND_STATE_COMMITTED {
		t.Errorf("round: %v, want committed with the 3 honest reports", r)
	}
	checkHonest(t, agents...)
}
