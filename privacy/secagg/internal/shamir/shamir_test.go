package shamir

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/fleetlearn/fleetlearn/privacy/secagg/internal/field"
)

func TestSplitCombine(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	src := rand.NewChaCha8([32]byte{1})
	for range 100 {
		n := 1 + r.IntN(40)
		th := 1 + r.IntN(n)
		xs := make([]uint32, 0, n)
		for _, x := range r.Perm(5000)[:n] {
			xs = append(xs, uint32(x+1))
		}
		secret, _, err := RandomElement(src)
		if err != nil {
			t.Fatal(err)
		}
		ys, err := Split(&secret, xs, th, src)
		if err != nil {
			t.Fatal(err)
		}
		// Any t shares recover the secret.
		idx := r.Perm(n)[:th]
		sx := make([]uint32, th)
		sy := make([]field.Element, th)
		for i, j := range idx {
			sx[i], sy[i] = xs[j], ys[j]
		}
		got, err := Combine(sx, sy)
		if err != nil {
			t.Fatal(err)
		}
		if !got.Equal(&secret) {
			t.Fatalf("n=%d t=%d: recovered a different secret", n, th)
		}
		// t−1 shares interpolate to something else (with overwhelming
		// probability), so the threshold is real.
		if th > 1 {
			got, err := Combine(sx[:th-1], sy[:th-1])
			if err != nil {
				t.Fatal(err)
			}
			if got.Equal(&secret) {
				t.Fatalf("n=%d t=%d: %d shares recovered the secret", n, th, th-1)
			}
		}
	}
}

func TestBadInput(t *testing.T) {
	var s field.Element
	src := rand.NewChaCha8([32]byte{2})
	for _, tc := range []struct {
		xs []uint32
		t  int
	}{{[]uint32{1, 2}, 3}, {[]uint32{1, 2}, 0}, {[]uint32{0, 2}, 1}, {[]uint32{2, 2}, 1}} {
		if _, err := Split(&s, tc.xs, tc.t, src); !errors.Is(err, ErrInput) {
			t.Errorf("Split(%v, %d) = %v", tc.xs, tc.t, err)
		}
	}
	if _, err := Combine([]uint32{1, 1}, make([]field.Element, 2)); !errors.Is(err, ErrInput) {
		t.Errorf("Combine repeated x: %v", err)
	}
	if _, err := Combine([]uint32{1}, nil); !errors.Is(err, ErrInput) {
		t.Errorf("Combine length mismatch: %v", err)
	}
}

func BenchmarkCombine31(b *testing.B) {
	src := rand.NewChaCha8([32]byte{3})
	secret, _, _ := RandomElement(src)
	xs := make([]uint32, 31)
	for i := range xs {
		xs[i] = uint32(3*i + 7)
	}
	ys, _ := Split(&secret, xs, 31, src)
	for b.Loop() {
		if _, err := Combine(xs, ys); err != nil {
			b.Fatal(err)
		}
	}
}
