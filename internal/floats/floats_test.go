package floats_test

import (
	"math"
	"testing"

	"github.com/fleetlearn/fleetlearn/internal/floats"
)

func TestFirstNonFinite(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	edge := []float32{math.MaxFloat32, -math.MaxFloat32, math.SmallestNonzeroFloat32, float32(math.Copysign(0, -1)), 1, -1}
	at := func(n, i int, x float32) []float32 {
		v := make([]float32, n)
		for j := range v {
			v[j] = edge[j%len(edge)]
		}
		if i >= 0 {
			v[i] = x
		}
		return v
	}
	for _, tc := range []struct {
		name string
		v    []float32
		want int
	}{
		{"empty", nil, -1},
		{"finite extremes", at(200, -1, 0), -1},
		{"NaN first", at(200, 0, nan), 0},
		{"+Inf in the second block", at(200, 70, inf), 70},
		{"-Inf last", at(200, 199, -inf), 199},
		{"NaN with payload in a short tail", at(130, 129, math.Float32frombits(0xffc00001)), 129},
		{"only a block's last value", at(64, 63, nan), 63},
	} {
		if got := floats.FirstNonFinite(tc.v); got != tc.want {
			t.Errorf("%s: FirstNonFinite = %d, want %d", tc.name, got, tc.want)
		}
	}
	// The first of several wins.
	v := at(300, 250, nan)
	v[100] = inf
	if got := floats.FirstNonFinite(v); got != 100 {
		t.Errorf("two non-finite values: got %d, want 100", got)
	}
}

func BenchmarkFirstNonFinite(b *testing.B) {
	v := make([]float32, 100_000)
	for i := range v {
		v[i] = float32(i%97) / 97
	}
	b.SetBytes(int64(4 * len(v)))
	for b.Loop() {
		if floats.FirstNonFinite(v) >= 0 {
			b.Fatal("finite input reported")
		}
	}
}
