package field

import (
	"math/big"
	"math/rand/v2"
	"testing"
)

var p = new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), 255), big.NewInt(19))

func toBig(e *Element) *big.Int {
	b := e.Bytes()
	for i, j := 0, len(b)-1; i < j; i, j = i+1, j-1 {
		b[i], b[j] = b[j], b[i]
	}
	return new(big.Int).SetBytes(b[:])
}

func fromBig(t *testing.T, x *big.Int) Element {
	t.Helper()
	be := x.FillBytes(make([]byte, Size))
	le := make([]byte, Size)
	for i := range be {
		le[i] = be[Size-1-i]
	}
	var e Element
	if err := e.SetBytes(le); err != nil {
		t.Fatalf("SetBytes(%v): %v", x, err)
	}
	return e
}

// randBig draws values biased towards the edges of the field, where carry
// and reduction bugs live.
func randBig(r *rand.Rand) *big.Int {
	switch r.IntN(4) {
	case 0:
		return big.NewInt(int64(r.IntN(40)))
	case 1:
		return new(big.Int).Sub(p, big.NewInt(int64(1+r.IntN(40))))
	default:
		b := make([]byte, 32)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		return new(big.Int).Mod(new(big.Int).SetBytes(b), p)
	}
}

func TestAgainstBig(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 3000 {
		x, y := randBig(r), randBig(r)
		a, b := fromBig(t, x), fromBig(t, y)
		var got Element
		check := func(op string, want *big.Int) {
			t.Helper()
			want.Mod(want, p)
			if g := toBig(&got); g.Cmp(want) != 0 {
				t.Fatalf("%s(%v, %v) = %v, want %v", op, x, y, g, want)
			}
		}
		got.Add(&a, &b)
		check("add", new(big.Int).Add(x, y))
		got.Sub(&a, &b)
		check("sub", new(big.Int).Sub(x, y))
		got.Mul(&a, &b)
		check("mul", new(big.Int).Mul(x, y))
		// Chained operations leave limbs unreduced; feed them on.
		var s Element
		s.Add(&a, &b)
		got.Mul(&s, &s)
		check("sq(add)", new(big.Int).Exp(new(big.Int).Add(x, y), big.NewInt(2), p))
		got.Invert(&a)
		if x.Sign() == 0 {
			check("inv", big.NewInt(0))
		} else {
			check("inv", new(big.Int).ModInverse(x, p))
		}
	}
}

func TestSetBytesRefusesNonCanonical(t *testing.T) {
	enc := func(x *big.Int) []byte {
		b := make([]byte, Size)
		be := x.FillBytes(make([]byte, Size))
		for i := range be {
			b[i] = be[Size-1-i]
		}
		return b
	}
	for _, x := range []*big.Int{p, new(big.Int).Add(p, big.NewInt(18))} {
		var e Element
		if err := e.SetBytes(enc(x)); err != ErrNonCanonical {
			t.Errorf("SetBytes(%v) = %v, want ErrNonCanonical", x, err)
		}
	}
	top := make([]byte, Size)
	top[31] = 0x80
	var e Element
	if err := e.SetBytes(top); err != ErrNonCanonical {
		t.Errorf("top bit: %v", err)
	}
	if err := e.SetBytes(make([]byte, 31)); err != ErrNonCanonical {
		t.Errorf("short: %v", err)
	}
	if err := e.SetBytes(enc(new(big.Int).Sub(p, big.NewInt(1)))); err != nil {
		t.Errorf("p-1: %v", err)
	}
}

func TestSetUint64(t *testing.T) {
	for _, x := range []uint64{0, 1, 1<<51 - 1, 1 << 51, 1<<64 - 1} {
		var e Element
		e.SetUint64(x)
		if g := toBig(&e); g.Cmp(new(big.Int).SetUint64(x)) != 0 {
			t.Errorf("SetUint64(%d) = %v", x, g)
		}
	}
}
