package coord

import (
	"encoding/json"
	"log/slog"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	natsjwt "github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/seeds"
	"github.com/fleetlearn/fleetlearn/internal/testwait"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/round"
)

// newShardHarness is a harness whose coordinator shards its plaintext
// rounds, with n aggregation workers, each on a NATS connection of its own
// as a standby replica's would be.
func newShardHarness(t *testing.T, n int) (*harness, []*ShardWorkers) {
	h := newHarness(t)
	h.c.Shutdown()
	h.deps.ShardAggregation = true
	h.restart()
	var ws []*ShardWorkers
	for range n {
		nc, err := nats.Connect(h.nc.ConnectedUrl())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		w, err := StartShardWorkers(nc, 1, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(w.Stop)
		ws = append(ws, w)
	}
	return h, ws
}

func (h *harness) shardReports(reader string) float64 {
	return counterValue(h.deps.Metrics.ShardReports.WithLabelValues(reader))
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	c.Write(&m)
	return m.GetCounter().GetValue()
}

// TestShardedRoundCommitsWeightedMean: workers read, check and sum the
// reports; the leader's combined model and metrics are those of the round
// it reads itself (TestRoundCommitsWeightedMean), and a report the workers
// refuse gets the leader's receipt with the worker's reason.
func TestShardedRoundCommitsWeightedMean(t *testing.T) {
	h, _ := newShardHarness(t, 2)
	task := h.start(h.baseTask(func(t *pb.Task) { t.CohortTarget = 4 }))
	ev := h.watch(task.Id)
	a, b, c := h.enroll("dev-a", 10), h.enroll("dev-b", 30), h.enroll("dev-c", 60)
	mallory := h.enroll("mallory", 5)
	plan := mallory.join()
	rep := mallory.signedUpdate(plan, constant(8, 0.1), 5, map[string]float64{"loss": 9})
	rep.Metrics.Values["loss"] = 0.01
	mallory.send(rep)
	if r := mallory.receipt(); r.Accepted || !containsAll(r.Reason, "signature does not verify") {
		t.Fatalf("altered metrics: %v", r)
	}
	for i, d := range []*device{a, b, c} {
		plan := d.join()
		if i == 0 {
			// The leader reads what its consumer delivered without bytes.
			d.evaluate(plan, 5, map[string]float64{"accuracy": 1})
			if r := d.receipt(); r.Accepted || !containsAll(r.Reason, "evaluation") {
				t.Fatalf("an evaluation report in a training round: %v", r)
			}
		}
		d.update(plan, constant(8, float32(i+1)/10), d.examples, map[string]float64{"loss": float64(i + 1)})
	}
	h.clk.Advance(20 * time.Second) // mallory holds a seat in silence now
	h.checkWeightedMean(task.Id, h.next(ev))
	for _, d := range []*device{a, b, c} {
		if r := d.receipt(); !r.Accepted {
			t.Fatalf("%s refused: %s", d.id, r.Reason)
		}
	}
	if w, l := h.shardReports("worker"), h.shardReports("leader"); w != 4 || l != 0 {
		t.Errorf("reports read by workers %v, by the leader %v; want 4 and 0", w, l)
	}
	if n := counterValue(h.deps.Metrics.ShardRereads); n != 0 {
		t.Errorf("%v reports read again", n)
	}
}

// TestShardWorkersLost: the workers go mid-round with the reports they
// summed. The report sent next finds no worker and the leader reads it; at
// the close the leader cannot collect the lost sums and reads their
// reports again, from the stream: the round commits every report, once.
func TestShardWorkersLost(t *testing.T) {
	h, ws := newShardHarness(t, 2)
	task := h.start(h.baseTask(nil))
	ev := h.watch(task.Id)
	a, b, c := h.enroll("dev-a", 10), h.enroll("dev-b", 30), h.enroll("dev-c", 60)
	plans := []*pb.RoundPlan{a.join(), b.join(), c.join()}
	for i, d := range []*device{a, b} {
		d.update(plans[i], constant(8, float32(i+1)/10), d.examples, map[string]float64{"loss": float64(i + 1)})
		if r := d.receipt(); !r.Accepted {
			t.Fatalf("%s refused: %s", d.id, r.Reason)
		}
	}
	for _, w := range ws {
		w.Stop()
	}
	c.update(plans[2], constant(8, 0.3), c.examples, map[string]float64{"loss": 3})
	h.checkWeightedMean(task.Id, h.next(ev))
	if w, l := h.shardReports("worker"), h.shardReports("leader"); w != 2 || l != 1 {
		t.Errorf("reports read by workers %v, by the leader %v; want 2 and 1", w, l)
	}
	if n := counterValue(h.deps.Metrics.ShardRereads); n != 2 {
		t.Errorf("%v reports read again, want 2", n)
	}
}

// TestShardedRoundWithoutWorkers: with sharding on and no worker in the
// queue group, the leader reads every report itself.
func TestShardedRoundWithoutWorkers(t *testing.T) {
	h, _ := newShardHarness(t, 0)
	task := h.start(h.baseTask(nil))
	ev := h.watch(task.Id)
	devs, plans := h.joinCohort(3)
	for i, d := range devs {
		d.update(plans[i], constant(8, 0.1), 10, nil)
	}
	if got := h.next(ev); got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED || got.Reported != 3 {
		t.Fatalf("round 1: %v", got)
	}
	if w, l := h.shardReports("worker"), h.shardReports("leader"); w != 0 || l != 3 {
		t.Errorf("reports read by workers %v, by the leader %v; want 0 and 3", w, l)
	}
}

// TestShardReportsOfOneDeviceInOrder: while a device's report is out with
// a worker, its next waits, and one more is refused; the leader takes them
// in order once the first is answered. The queue group's one member here
// is the test, answering "failed" when it chooses, so the leader reads
// each report itself.
func TestShardReportsOfOneDeviceInOrder(t *testing.T) {
	h, _ := newShardHarness(t, 0)
	nc, err := nats.Connect(h.nc.ConnectedUrl())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	held := make(chan *nats.Msg, 4)
	if _, err := nc.QueueSubscribe(subjectShardWork, shardQueue, func(m *nats.Msg) { held <- m }); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	answer := func() {
		t.Helper()
		select {
		case m := <-held:
			b, _ := json.Marshal(shardAnswer{Worker: "test", Failed: "the test's worker reads nothing"})
			if err := m.Respond(b); err != nil {
				t.Fatal(err)
			}
		case <-testwait.After(t):
			t.Fatal("no dispatch")
		}
	}
	task := h.start(h.baseTask(func(t *pb.Task) { t.CohortTarget, t.ReportGoal = 2, 2 }))
	ev := h.watch(task.Id)
	mallory, a := h.enroll("mallory", 10), h.enroll("dev-a", 10)
	plan := mallory.join()
	for i, id := range []string{"first", "second", "third"} {
		rep := mallory.signedUpdate(plan, constant(8, float32(i+1)/10), 10, nil)
		mallory.publish(wire.ReportSubject(rep.TaskId, rep.Round, mallory.id), rep, id)
	}
	// The first is out, the second waits, the third is refused at once.
	if r := mallory.receipt(); r.Accepted || !containsAll(r.Reason, "another report of mallory is being read") {
		t.Fatalf("third report: %v", r)
	}
	answer()
	if r := mallory.receipt(); !r.Accepted {
		t.Fatalf("first report: %v", r)
	}
	if r := mallory.receipt(); r.Accepted || !containsAll(r.Reason, "already reported") {
		t.Fatalf("second report: %v", r)
	}
	a.update(a.join(), constant(8, 0.1), 10, nil)
	answer()
	if got := h.next(ev); got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED || got.Reported != 2 {
		t.Fatalf("round 1: %v", got)
	}
	// (0.1 + 0.1) / 2 on w[0] = 1: mallory's first report counted, once.
	if got := h.current(task.Id).Flatten()[0]; math.Abs(float64(got-1.1)) > 1e-6 {
		t.Fatalf("model[0] = %v, want 1.1", got)
	}
}

// TestMatchCredits: a partial sum is taken only when it holds exactly the
// reports its worker was credited with.
func TestMatchCredits(t *testing.T) {
	credits := []shardCredit{{seq: 7}, {seq: 3}}
	ok := shardPartialMeta{Count: 2, Weight: 20, Seqs: []uint64{3, 7}, Dim: 8}
	if err := matchCredits(ok, credits, 8); err != nil {
		t.Fatal(err)
	}
	for name, m := range map[string]shardPartialMeta{
		"one more":  {Count: 3, Seqs: []uint64{3, 7, 9}, Dim: 8},
		"one less":  {Count: 1, Seqs: []uint64{3}, Dim: 8},
		"another":   {Count: 2, Seqs: []uint64{3, 8}, Dim: 8},
		"count off": {Count: 3, Seqs: []uint64{3, 7}, Dim: 8},
		"dim":       {Count: 2, Seqs: []uint64{3, 7}, Dim: 9},
		"broken":    {Count: 2, Seqs: []uint64{3, 7}, Dim: 8, Broken: "torn"},
	} {
		if err := matchCredits(m, credits, 8); err == nil {
			t.Errorf("%s: taken", name)
		}
	}
}

// TestShardLayoutBounds: a dispatch's tensors are bounded before a worker
// allocates a sum for them.
func TestShardLayoutBounds(t *testing.T) {
	l, err := shardLayout([]round.Tensor{{Name: "w", Shape: []uint64{2, 3}}, {Name: "b", Shape: []uint64{3}}})
	if err != nil || l.Size() != 9 || l.Entries[1].Offset != 6 {
		t.Fatalf("layout %+v, %v", l, err)
	}
	for name, ts := range map[string][]round.Tensor{
		"zero dim": {{Name: "w", Shape: []uint64{0, 3}}},
		"huge":     {{Name: "w", Shape: []uint64{1 << 20, 1 << 20}}},
		"overflow": {{Name: "w", Shape: []uint64{math.MaxUint64, 2}}},
		"sum over": {{Name: "a", Shape: []uint64{1 << 29}}, {Name: "b", Shape: []uint64{1 << 29}}, {Name: "c", Shape: []uint64{1}}},
	} {
		if _, err := shardLayout(ts); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// FuzzPartialPage: a partial sum's page decodes or is refused, never
// panics, and what decodes encodes back to the same values.
func FuzzPartialPage(f *testing.F) {
	f.Add(encodePartialPage(shardPartialMeta{Count: 2, Weight: 3, Seqs: []uint64{1, 2}, Dim: 3}, []float64{1, -2, math.Pi}))
	f.Add(encodePartialPage(shardPartialMeta{Broken: "torn"}, nil))
	seeds.AddTo(f, "partialpage", "*")
	f.Fuzz(func(t *testing.T, b []byte) {
		meta, vals, err := decodePartialPage(b)
		if err != nil {
			return
		}
		if len(vals) > shardPage {
			t.Fatalf("%d values in a page", len(vals))
		}
		_, again, err := decodePartialPage(encodePartialPage(meta, vals))
		if err != nil || len(again) != len(vals) {
			t.Fatalf("re-encoded page: %v", err)
		}
		for i := range vals {
			if math.Float64bits(vals[i]) != math.Float64bits(again[i]) {
				t.Fatalf("value %d changed", i)
			}
		}
	})
}

// TestShardSubjectsAreTheServicesOwn: no device and no NATS tool may
// publish or subscribe to the aggregation workers' subjects: a device in
// the queue group could take reports and answer "accepted". Only the
// service user (every subject) dispatches, answers and collects.
func TestShardSubjectsAreTheServicesOwn(t *testing.T) {
	dev, err := identity.DevicePermissions("dev-a")
	if err != nil {
		t.Fatal(err)
	}
	perms := map[string]natsjwt.Permissions{"device": dev}
	for _, role := range []identity.NATSToolRole{identity.NATSObserver, identity.NATSOperator, identity.NATSSystem} {
		if perms[string(role)], err = identity.ToolPermissions(role); err != nil {
			t.Fatal(err)
		}
	}
	for who, p := range perms {
		for _, subj := range []string{subjectShardWork, subjectShardCollect + "0a1b2c-0", subjectShardDrop} {
			for _, pat := range append(slices.Clone(p.Pub.Allow), p.Sub.Allow...) {
				if subjectMatches(pat, subj) {
					t.Errorf("%s may use %s (allowed %q)", who, subj, pat)
				}
			}
		}
	}
}

// subjectMatches reports whether a NATS subject pattern matches subj.
func subjectMatches(pattern, subj string) bool {
	pt, st := strings.Split(pattern, "."), strings.Split(subj, ".")
	for i, p := range pt {
		if p == ">" {
			return i < len(st)
		}
		if i >= len(st) || p != "*" && p != st[i] {
			return false
		}
	}
	return len(pt) == len(st)
}
