package wasm

import (
	"encoding/json"
	"errors"
	"maps"
	"math"
	"testing"
)

// FuzzDecodeResult feeds arbitrary result documents to the decoder of what a
// module writes through output_write. It must never panic, must fail only with
// ErrResult, and whatever it accepts must respect the invariants the server
// relies on when it weights updates by example count.
func FuzzDecodeResult(f *testing.F) {
	for _, s := range []struct {
		doc      string
		examples int
	}{
		{`{"num_examples":3,"metrics":{"loss":0.5,"accuracy":1}}`, 3},
		{`{"num_examples":4}`, 3},
		{`{"num_examples":-1}`, 3},
		{`{"num_examples":1}{}`, 1},
		{`{"num_examples":1,"metrics":{"loss":1e999}}`, 1},
		{`{"num_examples":1,"metrics":{"":1}}`, 5},
		{`{"NUM_EXAMPLES":2,"Metrics":null}`, 2},
		{`{"num_examples":2,"weights":[1,2]}`, 2},
		{`null`, 0},
		{``, 0},
	} {
		f.Add([]byte(s.doc), s.examples)
	}
	f.Fuzz(func(t *testing.T, b []byte, examples int) {
		r, err := decodeResult(b, examples)
		if err != nil {
			if !errors.Is(err, ErrResult) {
				t.Fatalf("decodeResult(%q) error %v does not wrap ErrResult", b, err)
			}
			return
		}
		if r.NumExamples < 0 || r.NumExamples > examples {
			t.Fatalf("decodeResult(%q, %d) accepted num_examples %d", b, examples, r.NumExamples)
		}
		if len(r.Metrics) > maxMetrics {
			t.Fatalf("decodeResult(%q) accepted %d metrics", b, len(r.Metrics))
		}
		for k, v := range r.Metrics {
			if k == "" || len(k) > 64 || math.IsNaN(v) || math.IsInf(v, 0) {
				t.Fatalf("decodeResult(%q) accepted metric %q = %v", b, k, v)
			}
		}
		// What the decoder accepts, re-encoded, it accepts again unchanged.
		again, err := json.Marshal(r)
		if err != nil {
			t.Fatalf("re-encoding accepted result %+v: %v", r, err)
		}
		r2, err := decodeResult(again, examples)
		if err != nil || r2.NumExamples != r.NumExamples || !maps.Equal(r2.Metrics, r.Metrics) {
			t.Fatalf("accepted %q, then %q decodes to %+v, %v", b, again, r2, err)
		}
	})
}
