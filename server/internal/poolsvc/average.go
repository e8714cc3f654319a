package poolsvc

import (
	"encoding/binary"
	"math"
	"slices"

	"google.golang.org/grpc/codes"

	"github.com/fleetlearn/fleetlearn/aggregator"
)

// MaxAverageBytes bounds one rank's parameters in Average.
const MaxAverageBytes = 7 << 20

// syncRound is one open parameter average of an attempt.
type syncRound struct {
	step    int64
	params  [][]float32
	weights []float64
	arrived int
	done    chan struct{}
	result  []byte
	err     error
}

func (r *syncRound) finish(res []byte, err error) {
	r.result, r.err = res, err
	close(r.done)
}

func (rt *jobRT) abortSync(why string) {
	if rt.sync != nil {
		rt.sync.finish(nil, errorf(codes.Aborted, "average of job %s step %d abandoned: %s", rt.id(), rt.sync.step, why))
		rt.sync = nil
	}
}

// decodeParams parses little-endian float32s and refuses non-finite ones.
func decodeParams(b []byte) ([]float32, error) {
	if len(b) == 0 || len(b)%4 != 0 || len(b) > MaxAverageBytes {
		return nil, invalidf("params: %d bytes; want a non-empty multiple of 4 up to %d", len(b), MaxAverageBytes)
	}
	out := make([]float32, len(b)/4)
	for i := range out {
		v := math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return nil, invalidf("params: value %d is %v; only finite values can be averaged", i, v)
		}
		out[i] = v
	}
	return out, nil
}

func encodeParams(v []float32) []byte {
	out := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(x))
	}
	return out
}

// contribute adds rank's parameters to the attempt's open average; the
// loop calls it. A rank out of step with the open average fails it for
// every rank, as ranks resumed from different checkpoints would.
func (rt *jobRT) contribute(rank uint32, step int64, params []float32, weight float64) (*syncRound, error) {
	if last, ok := rt.lastSync[rank]; ok && step <= last {
		// The same contribution again is a retry of a call whose answer
		// was lost (the worker retries on UNAVAILABLE): it joins, or gets
		// the result of, the average it is already part of.
		for _, r := range []*syncRound{rt.sync, rt.synced} {
			if r != nil && r.step == step && step == last && r.weights[rank] == weight && slices.Equal(r.params[rank], params) {
				return r, nil
			}
		}
		return nil, invalidf("average: rank %d already contributed step %d; each step once, in increasing order", rank, last)
	}
	if w, ok := rt.weights[rank]; ok && w != weight {
		return nil, invalidf("average: rank %d weight %v, but it was %v at its first sync; the weight is the shard's example count and cannot change", rank, weight, w)
	}
	r := rt.sync
	if r != nil && r.step != step {
		rt.abortSync("ranks disagree about the step")
		return nil, invalidf("average: rank %d at step %d while step %d is open", rank, step, r.step)
	}
	if r == nil {
		world := len(rt.leases)
		r = &syncRound{step: step, params: make([][]float32, world), weights: make([]float64, world), done: make(chan struct{})}
		rt.sync = r
	}
	for _, p := range r.params {
		if p != nil && len(p) != len(params) {
			return nil, invalidf("average: rank %d sent %d values, another rank %d", rank, len(params), len(p))
		}
	}
	r.params[rank], r.weights[rank] = params, weight
	rt.weights[rank], rt.lastSync[rank] = weight, step
	if r.arrived++; r.arrived < len(r.params) {
		return r, nil
	}
	rt.sync, rt.synced = nil, r
	mean, err := fedAvg(r.params, r.weights)
	if err != nil {
		r.finish(nil, errorf(codes.InvalidArgument, "average step %d: %v", step, err))
	} else {
		r.finish(encodeParams(mean), nil)
	}
	return r, nil
}

// fedAvg is the aggregator's weighted mean over the ranks' parameters,
// added in rank order so the float64 sums, and the result, do not depend
// on arrival order.
func fedAvg(params [][]float32, weights []float64) ([]float32, error) {
	return aggregator.WeightedMean(params, weights)
}
