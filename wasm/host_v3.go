package wasm

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"unicode/utf8"

	"github.com/tetratelabs/wazero/api"

	"github.com/fleetlearn/fleetlearn/model/sgd"
)

// sgdHyperBytes is what sgd_hyper writes: epochs, batch_size and
// eval_batch_size as int32, learning_rate and mu as float32.
const sgdHyperBytes = 20

// v3State is what ABI v3's host services need beyond v1's call state.
type v3State struct {
	// req is the request document the module reads: sgd_hyper parses its
	// "hyper" bytes (requestHyper), sgd_order uses its "seed", param_name
	// and param_shape read its "params".
	req *request
	// parsed caches sgd_hyper's parse: a module may ask once per batch, and
	// the task's JSON is the same each time. A parse error ends the call,
	// so only success is cached.
	parsed   sgd.Hyper
	parsedOK bool
	result   builtResult
}

// builtResult is the result a module builds with result_examples and
// result_metric instead of writing the JSON document.
type builtResult struct {
	used     bool // either function was called
	examples bool // result_examples was called
	n        int32
	metrics  map[string]float64
}

// hostFunctionsV3 is what ABI v3 adds to v2's functions: services for
// modules without a language runtime, which can neither parse the request's
// JSON nor format the result's floats. The SGD recipe (model/sgd) is
// Fleetlearn's, so the host serves it and a module gets the values the
// native trainer uses. fleetlearn_v3 serves these and all of v1's and v2's.
var hostFunctionsV3 = []hostFn{
	{"sgd_hyper", 3, []api.ValueType{i32}, nil, func(s *callState, mod api.Module, st []uint64) {
		b := s.memRange("sgd_hyper", mod, u32(st[0]), sgdHyperBytes)
		h := s.sgdHyper()
		// Validate bounds every field far inside int32 and float32 range.
		binary.LittleEndian.PutUint32(b[0:], uint32(int32(h.Epochs)))
		binary.LittleEndian.PutUint32(b[4:], uint32(int32(h.BatchSize)))
		binary.LittleEndian.PutUint32(b[8:], uint32(int32(h.EvalBatchSize)))
		binary.LittleEndian.PutUint32(b[12:], math.Float32bits(h.LearningRate))
		binary.LittleEndian.PutUint32(b[16:], math.Float32bits(h.Mu))
	}},
	{"sgd_order", 3, []api.ValueType{i32, i32, i32}, nil, func(s *callState, mod api.Module, st []uint64) {
		const op = "sgd_order"
		ptr, n, epoch := u32(st[0]), s32(st[1]), s32(st[2])
		if int(n) != s.data.Len() {
			s.abort(fmt.Errorf("%w: %s: n %d, epoch %d: n must be the call's data_count, %d; an order covers every local example",
				ErrKernel, op, n, epoch, s.data.Len()))
		}
		if epoch < 0 || epoch >= sgd.MaxEpochs {
			s.abort(fmt.Errorf("%w: %s: n %d, epoch %d: epoch must be in [0,%d)", ErrKernel, op, n, epoch, sgd.MaxEpochs))
		}
		b := s.memRange(op, mod, ptr, elemBytes(op, s, uint32(n)))
		s.charge(op, int64(n))
		for i, v := range sgd.Order(int(n), s.v3.req.Seed, int(epoch)) {
			binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
		}
	}},
	{"param_name", 3, []api.ValueType{i32, i32, i32}, []api.ValueType{i32}, func(s *callState, mod api.Module, st []uint64) {
		const op = "param_name"
		i, ptr, capacity := s.paramArgs(op, "the length", st)
		name := s.v3.req.Params[i].Name
		// With nothing to copy the pointer is not used, so not checked.
		if k := min(capacity, len(name)); k > 0 {
			b := s.memRange(op, mod, ptr, uint32(k))
			s.charge(op, int64(k))
			copy(b, name)
		}
		st[0] = uint64(len(name))
	}},
	{"param_shape", 3, []api.ValueType{i32, i32, i32}, []api.ValueType{i32}, func(s *callState, mod api.Module, st []uint64) {
		const op = "param_shape"
		i, ptr, capacity := s.paramArgs(op, "the rank", st)
		shape := s.v3.req.Params[i].Shape
		if k := min(capacity, len(shape)); k > 0 {
			b := s.memRange(op, mod, ptr, uint32(4*k))
			s.charge(op, int64(k))
			for j, dim := range shape[:k] {
				// A tensor's dimensions multiply to its length, so each fits an int32.
				binary.LittleEndian.PutUint32(b[4*j:], uint32(int32(dim)))
			}
		}
		st[0] = uint64(len(shape))
	}},
	{"result_examples", 3, []api.ValueType{i32}, nil, func(s *callState, _ api.Module, st []uint64) {
		// The count is checked with the rest of the result, by decodeResult.
		r := &s.v3.result
		r.used, r.examples, r.n = true, true, s32(st[0])
	}},
	{"result_metric", 3, []api.ValueType{i32, i32, f64}, nil, func(s *callState, mod api.Module, st []uint64) {
		const op = "result_metric"
		ptr, n, v := u32(st[0]), s32(st[1]), api.DecodeF64(st[2])
		if n < 1 || n > maxMetricName {
			s.abort(fmt.Errorf("%w: %s: name of %d bytes; a metric name has 1 to %d", ErrResult, op, n, maxMetricName))
		}
		name := string(s.memRange(op, mod, ptr, uint32(n)))
		// The result travels as JSON and protobuf strings, which would
		// replace or refuse invalid bytes.
		if !utf8.ValidString(name) {
			s.abort(fmt.Errorf("%w: %s: name %q is not UTF-8", ErrResult, op, name))
		}
		if math.IsNaN(v) || math.IsInf(v, 0) {
			s.abort(fmt.Errorf("%w: %s: metric %q is %v; report only finite values", ErrResult, op, name, v))
		}
		r := &s.v3.result
		if _, ok := r.metrics[name]; !ok && len(r.metrics) >= maxMetrics {
			s.abort(fmt.Errorf("%w: %s: metric %q would be the %dth, limit %d", ErrResult, op, name, len(r.metrics)+1, maxMetrics))
		}
		if r.metrics == nil {
			r.metrics = map[string]float64{}
		}
		r.used = true
		r.metrics[name] = v
	}},
}

// paramArgs checks the (i, ptr, cap) arguments of param_name and
// param_shape: i must name a parameter and cap may not be negative (0 asks
// only for what); ptr is checked when something is copied.
func (s *callState) paramArgs(op, what string, st []uint64) (i int, ptr uint32, capacity int) {
	idx, ptr, c := s32(st[0]), u32(st[1]), s32(st[2])
	if idx < 0 || int(idx) >= s.nparams {
		s.abort(fmt.Errorf("%w: %s: index %d not in [0,%d)", ErrKernel, op, idx, s.nparams))
	}
	if c < 0 {
		s.abort(fmt.Errorf("%w: %s: buffer capacity %d is negative; pass 0 to ask only for %s", ErrKernel, op, c, what))
	}
	return int(idx), ptr, int(c)
}

// sgdHyper parses the request's hyper-parameters as model/sgd does. They
// come from the task, not from the module, so an error is the caller's.
func (s *callState) sgdHyper() sgd.Hyper {
	if !s.v3.parsedOK {
		h, err := sgd.ParseHyper(s.v3.req.Hyper)
		if err != nil {
			s.abort(fmt.Errorf("%w: sgd_hyper: the task's hyper-parameters: %w; fix them in the task", ErrInvalidCall, err))
		}
		s.v3.parsed, s.v3.parsedOK = h, true
	}
	return s.v3.parsed
}

// resultDoc is the result document of a call that returned 0: what the
// module wrote with output_write, or the result it built with
// result_examples and result_metric, as JSON, so that decodeResult
// validates both alike.
func (s *callState) resultDoc() ([]byte, error) {
	r := s.v3.result
	switch {
	case !r.used:
		return s.output, nil
	case s.wrote:
		return nil, fmt.Errorf("%w: use output_write or result_examples/result_metric, not both", ErrResult)
	case !r.examples:
		return nil, fmt.Errorf("%w: result_metric without result_examples; call result_examples with the number of examples used", ErrResult)
	}
	b, err := json.Marshal(moduleResult{NumExamples: int(r.n), Metrics: r.metrics})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrResult, err)
	}
	return b, nil
}
