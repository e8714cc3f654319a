package sgd_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/fleetlearn/fleetlearn/model/sgd"
)

func TestParseHyper(t *testing.T) {
	h, err := sgd.ParseHyper(nil)
	if err != nil || h != sgd.Defaults {
		t.Fatalf("empty: %+v %v", h, err)
	}
	h, err = sgd.ParseHyper([]byte(`{"epochs":3,"learning_rate":0.5,"mu":0.01}`))
	if err != nil || h.Epochs != 3 || h.LearningRate != 0.5 || h.Mu != 0.01 || h.BatchSize != sgd.Defaults.BatchSize {
		t.Fatalf("got %+v %v", h, err)
	}
	for _, bad := range []string{
		`{"epochs":0}`, `{"epochs":1001}`, `{"batch_size":0}`, `{"batch_size":70000}`,
		`{"learning_rate":0}`, `{"learning_rate":-1}`, `{"mu":-0.1}`, `{"eval_batch_size":-1}`,
		`{"epoch":1}`, `{"epochs":"1"}`, `not json`, `{"learning_rate":1e39}`,
	} {
		if _, err := sgd.ParseHyper([]byte(bad)); !errors.Is(err, sgd.ErrHyper) {
			t.Errorf("%s: got %v, want ErrHyper", bad, err)
		}
	}
}

func TestOrder(t *testing.T) {
	for _, n := range []int{0, 1, 2, 10, 1000} {
		o := sgd.Order(n, 7, 0)
		s := slices.Clone(o)
		slices.Sort(s)
		for i, v := range s {
			if int(v) != i {
				t.Fatalf("n=%d: not a permutation: %v", n, o)
			}
		}
	}
	a, b := sgd.Order(100, 1, 0), sgd.Order(100, 1, 0)
	if !slices.Equal(a, b) {
		t.Fatal("same seed and epoch gave different orders")
	}
	if slices.Equal(a, sgd.Order(100, 1, 1)) || slices.Equal(a, sgd.Order(100, 2, 0)) {
		t.Fatal("another epoch or seed gave the same order")
	}
	// Position of element 0 over many seeds should be roughly uniform.
	const n, trials = 10, 20000
	var hist [n]int
	for s := range uint64(trials) {
		hist[slices.Index(sgd.Order(n, s, 0), 0)]++
	}
	for i, c := range hist {
		if c < trials/n*8/10 || c > trials/n*12/10 {
			t.Fatalf("position %d got %d of %d: order is biased %v", i, c, trials, hist)
		}
	}
}

func TestBatches(t *testing.T) {
	o := sgd.Order(10, 3, 0)
	bs := sgd.Batches(o, 4)
	if len(bs) != 3 || len(bs[0]) != 4 || len(bs[2]) != 2 || !slices.Equal(slices.Concat(bs...), o) {
		t.Fatalf("batches %v of %v", bs, o)
	}
}

// The example order is part of the recipe: a module and the native trainer
// visiting examples differently would not agree.
func ExampleOrder() {
	fmt.Println(sgd.Order(8, 42, 0))
	fmt.Println(sgd.Batches(sgd.Order(8, 42, 0), 3))
	// Output:
	// [7 4 1 2 5 6 0 3]
	// [[7 4 1] [2 5 6] [0 3]]
}
