package poolsvc

import (
	"math"
	"time"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// Checkpoint stalls are how long taking a checkpoint blocked a rank's
// training loop, as the rank measured it and sent it with the commit
// (CommitCheckpointRequest.stall_seconds). They are the worker's word: shown
// and exported to bound, never charged. A job keeps them as a histogram of
// fixed buckets in its record (PoolCheckpointStall), so the summary has one
// size whatever the job's length and survives a server restart.

// MaxCheckpointStall is the longest stall a report counts as: a longer one
// is recorded as this long.
const MaxCheckpointStall = time.Hour

// Bucket i of a job's stall histogram holds the stalls in
// (stallBound(i-1), stallBound(i)], bucket 0 those up to stallBase: eight
// buckets per doubling, 9% wide, from 10 µs to MaxCheckpointStall.
const (
	stallBase      = 10e-6 // seconds
	stallPerOctave = 8
)

func stallBound(i int) float64 { return stallBase * math.Exp2(float64(i)/stallPerOctave) }

func stallBucket(sec float64) int {
	if sec <= stallBase {
		return 0
	}
	i := int(math.Ceil(stallPerOctave * math.Log2(sec/stallBase)))
	// Log2's rounding may put a value at or next to a bound one bucket off.
	for stallBound(i) < sec {
		i++
	}
	for i > 0 && stallBound(i-1) >= sec {
		i--
	}
	return i
}

// maxStallBuckets is the length of a histogram holding MaxCheckpointStall.
var maxStallBuckets = stallBucket(MaxCheckpointStall.Seconds()) + 1

// reportedStall checks a commit's stall: none (not measured), or a finite
// number of seconds that is not negative, clipped to MaxCheckpointStall.
func reportedStall(req *pb.CommitCheckpointRequest) (sec float64, ok bool, err error) {
	if req.StallSeconds == nil {
		return 0, false, nil
	}
	v := req.GetStallSeconds()
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return 0, false, invalidf("commit checkpoint: stall_seconds %v: want a finite number of seconds, not negative", v)
	}
	return min(v, MaxCheckpointStall.Seconds()), true, nil
}

// noteStall adds one rank's stall of sec seconds, already checked, to the
// job's summary and to the tenant's histogram. The caller stores the
// record.
func (s *Service) noteStall(rt *jobRT, sec float64) {
	st := rt.rec.CheckpointStall
	if st == nil {
		st = &pb.PoolCheckpointStall{}
		rt.rec.CheckpointStall = st
	}
	i := stallBucket(sec)
	if i >= len(st.Counts) {
		st.Counts = append(st.Counts, make([]uint64, i+1-len(st.Counts))...)
	}
	st.Counts[i]++
	st.Count++
	st.TotalSeconds += sec
	st.MaxSeconds = max(st.MaxSeconds, sec)
	st.P50Seconds = stallQuantile(st, 0.5)
	st.P99Seconds = stallQuantile(st, 0.99)
	s.d.Metrics.PoolCheckpointStall.WithLabelValues(rt.spec.Tenant).Observe(sec)
}

// stallQuantile is the upper bound of the bucket holding the q-quantile of
// st's stalls (nearest rank), at most the largest stall.
func stallQuantile(st *pb.PoolCheckpointStall, q float64) float64 {
	rank := uint64(math.Ceil(q * float64(st.Count)))
	var seen uint64
	for i, n := range st.Counts {
		if seen += n; seen >= rank {
			return min(stallBound(i), st.MaxSeconds)
		}
	}
	return st.MaxSeconds
}
