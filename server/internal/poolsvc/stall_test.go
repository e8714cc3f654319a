package poolsvc

import (
	"math"
	"strconv"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/pool/checkpoint"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/metrics"
)

// commitStall is commit with the stall the rank reports, nil for none.
func (w *worker) commitStall(r *pb.RankRef, job string, step int64, stall *float64, vals ...float32) (*pb.CommitCheckpointResponse, error) {
	w.e.t.Helper()
	b, err := manifestFor(w.e.t, job, step, vals, func(d checkpoint.Digest, data []byte) error {
		_, err := w.c.PutCheckpointBlob(w.ctx, &pb.PutCheckpointBlobRequest{Ref: r, Digest: d.String(), Data: data})
		return err
	})
	if err != nil {
		return nil, err
	}
	return w.c.CommitCheckpoint(w.ctx, &pb.CommitCheckpointRequest{Ref: r, Manifest: b, StallSeconds: stall})
}

// stallHistogram reads the default tenant's fleetlearn_pool_checkpoint_stall_seconds.
func stallHistogram(t *testing.T, m *metrics.M) (count uint64, sum float64) {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "fleetlearn_pool_checkpoint_stall_seconds" {
			continue
		}
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "tenant" && l.GetValue() == DefaultTenant {
					return s.GetHistogram().GetSampleCount(), s.GetHistogram().GetSampleSum()
				}
			}
		}
	}
	return 0, 0
}

// TestCheckpointStallSummary: the stalls ranks send with their commits
// make the job's summary (count, p50, p99, max, total) and the tenant's
// histogram; a commit without one counts in neither, and the summary
// survives a server restart.
func TestCheckpointStallSummary(t *testing.T) {
	m := metrics.New()
	e := newEnv(t, func(d *Deps) { d.Metrics = m })
	ws, ls := startGang(t, e, "stalls", 1)
	w, r := ws[0], ref(ws[0], ls[0])
	stalls := []float64{0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.007, 0.008, 0.5}
	var total float64
	for i, sec := range stalls {
		if _, err := w.commitStall(r, "stalls", int64(10*(i+1)), proto.Float64(sec), float32(i)); err != nil {
			t.Fatal(err)
		}
		total += sec
	}
	// A command job's commit measures no stall.
	if _, err := w.commitStall(r, "stalls", 100, nil, 9); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		st := e.job("stalls").GetCheckpointStall()
		if st.GetCount() != 9 || st.GetMaxSeconds() != 0.5 || math.Abs(st.GetTotalSeconds()-total) > 1e-12 {
			t.Fatalf("%s: summary %v, want 9 stalls, max 0.5 s, total %v s", when, st, total)
		}
		// The median is the fifth, 5 ms, to within its bucket; the 99th
		// percentile the largest.
		if p50 := st.GetP50Seconds(); p50 < 0.005 || p50 > 0.005*1.0906 {
			t.Errorf("%s: p50 %v s, want 5 ms to within 9%%", when, p50)
		}
		if st.GetP99Seconds() != 0.5 {
			t.Errorf("%s: p99 %v s, want 0.5", when, st.GetP99Seconds())
		}
		var n uint64
		for _, c := range st.GetCounts() {
			n += c
		}
		if n != 9 {
			t.Errorf("%s: buckets hold %d stalls, want 9", when, n)
		}
	}
	check("running")
	if n, sum := stallHistogram(t, m); n != 9 || math.Abs(sum-total) > 1e-12 {
		t.Errorf("histogram has %d stalls summing to %v s, want 9 and %v", n, sum, total)
	}
	e.restart()
	check("after a restart")
}

// TestCheckpointStallHostile: a stall is the worker's word, so it is
// bounded: NaN, infinite or negative figures refuse the commit, which
// stores nothing; a huge one counts as MaxCheckpointStall.
func TestCheckpointStallHostile(t *testing.T) {
	m := metrics.New()
	e := newEnv(t, func(d *Deps) { d.Metrics = m })
	ws, ls := startGang(t, e, "hostile", 1)
	w, r := ws[0], ref(ws[0], ls[0])
	for _, bad := range []float64{math.NaN(), math.Inf(1), math.Inf(-1), -1e-9, -3600} {
		_, err := w.commitStall(r, "hostile", 10, proto.Float64(bad), 1)
		wantCode(t, "a stall of "+strconv.FormatFloat(bad, 'g', -1, 64), err, codes.InvalidArgument)
	}
	if j := e.job("hostile"); j.GetCommittedStep() != 0 || j.GetCheckpointStall() != nil {
		t.Fatalf("refused commits left committed step %d and stalls %v", j.GetCommittedStep(), j.GetCheckpointStall())
	}
	if _, err := w.commitStall(r, "hostile", 10, proto.Float64(1e300), 1); err != nil {
		t.Fatal(err)
	}
	if _, err := w.commitStall(r, "hostile", 20, proto.Float64(0), 2); err != nil {
		t.Fatal(err)
	}
	st := e.job("hostile").GetCheckpointStall()
	if hour := MaxCheckpointStall.Seconds(); st.GetCount() != 2 || st.GetMaxSeconds() != hour || st.GetTotalSeconds() != hour || st.GetP99Seconds() != hour {
		t.Fatalf("summary %v, want two stalls, the huge one clipped to %v s", st, hour)
	}
	if len(st.GetCounts()) != maxStallBuckets || maxStallBuckets != 229 {
		t.Fatalf("%d buckets for a clipped stall (maxStallBuckets %d), want 229", len(st.GetCounts()), maxStallBuckets)
	}
	if n, sum := stallHistogram(t, m); n != 2 || sum != MaxCheckpointStall.Seconds() {
		t.Fatalf("histogram has %d stalls summing to %v s, want 2 and an hour", n, sum)
	}
}

// TestStallBuckets: every stall falls in the bucket whose bounds hold it,
// and the buckets grow by 2^(1/8).
func TestStallBuckets(t *testing.T) {
	secs := []float64{0, 1e-9, stallBase, 1.0000001 * stallBase, 1e-4, 0.005, 0.0123, 1, 42, 3599.9, 3600}
	for i := range maxStallBuckets {
		secs = append(secs, stallBound(i), math.Nextafter(stallBound(i), 0), math.Nextafter(stallBound(i), 1e9))
	}
	for _, sec := range secs {
		i := stallBucket(sec)
		if sec > stallBound(i) || i > 0 && sec <= stallBound(i-1) {
			t.Errorf("%v s in bucket %d, (%v, %v]", sec, i, stallBound(i-1), stallBound(i))
		}
	}
	for i := 1; i < maxStallBuckets; i++ {
		if r := stallBound(i) / stallBound(i-1); math.Abs(r-math.Exp2(1.0/stallPerOctave)) > 1e-9 {
			t.Fatalf("bucket %d is %v times the one before", i, r)
		}
	}
}
