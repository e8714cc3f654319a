package secagg_test

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/privacy/secagg"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// TestPackRoundTrip: packed values take ⌈bits/8⌉ bytes each on the wire
// and unpack to the same values.
func TestPackRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, bits := range []int{1, 7, 8, 9, 16, 20, 24, 31, 32} {
		vals := make([]uint32, 1000)
		for i := range vals {
			vals[i] = r.Uint32() & uint32(1<<bits-1)
		}
		m := &pb.MaskedUpdate{ParticipantId: 3, Bits: uint32(bits), Values: slices.Clone(vals)}
		fixed := proto.Size(m)
		if err := secagg.Pack(m); err != nil {
			t.Fatal(err)
		}
		if len(m.Packed) != secagg.PackedWidth(bits)*len(vals) || m.Values != nil {
			t.Fatalf("%d bits: %d packed bytes", bits, len(m.Packed))
		}
		t.Logf("%2d bits: %d bytes as fixed32, %d packed", bits, fixed, proto.Size(m))
		if err := secagg.Unpack(m, bits, len(vals)); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(m.Values, vals) || m.Packed != nil {
			t.Fatalf("%d bits: values changed in the round trip", bits)
		}
		// Values (older agents) pass through unchanged.
		if err := secagg.Unpack(m, bits, len(vals)); err != nil || !slices.Equal(m.Values, vals) {
			t.Fatalf("%d bits: fixed32 values: %v", bits, err)
		}
	}
}

// TestUnpackRefuses: a packed update of the wrong length, ring or range, or
// carrying both forms, is refused before it reaches the sum.
func TestUnpackRefuses(t *testing.T) {
	packed := func(bits int, b []byte) *pb.MaskedUpdate {
		return &pb.MaskedUpdate{ParticipantId: 1, Bits: uint32(bits), Packed: b}
	}
	for _, c := range []struct {
		name string
		m    *pb.MaskedUpdate
		bits int
		dim  int
	}{
		{"nil", nil, 8, 2},
		{"truncated", packed(8, []byte{1}), 8, 2},
		{"oversized", packed(8, []byte{1, 2, 3}), 8, 2},
		{"another ring", packed(16, []byte{1, 2, 3, 4}), 8, 2},
		{"over range", packed(12, []byte{0xff, 0xff}), 12, 1},
		{"both forms", &pb.MaskedUpdate{Bits: 8, Packed: []byte{1}, Values: []uint32{1}}, 8, 1},
		{"dimension over MaxDim", packed(8, []byte{1}), 8, secagg.MaxDim + 1},
	} {
		err := secagg.Unpack(c.m, c.bits, c.dim)
		if !errors.Is(err, secagg.ErrMalformed) {
			t.Errorf("%s: error %v, want ErrMalformed", c.name, err)
			continue
		}
		t.Logf("%s: %v", c.name, err)
	}
	if err := secagg.Pack(&pb.MaskedUpdate{Bits: 8, Values: []uint32{256}}); !errors.Is(err, secagg.ErrMalformed) {
		t.Fatalf("Pack of a value beyond the ring: %v", err)
	}
}

// TestQuantizeResidual: the residual is what rounding lost, so code/f plus
// residual gives back each clipped element, and it stays under one step.
func TestQuantizeResidual(t *testing.T) {
	const n, bits, clip = 10, 8, 0.05
	q, err := secagg.NewQuantizer(bits, clip, n, 1)
	if err != nil {
		t.Fatal(err)
	}
	x := []float32{0.01, -0.02, 0.049, 0.2, -0.3, 0}
	res := make([]float32, len(x))
	v, err := q.QuantizeResidual(x, 1, rand.New(rand.NewPCG(1, 1)), res)
	if err != nil {
		t.Fatal(err)
	}
	plain, _ := q.Quantize(x, 1, rand.New(rand.NewPCG(1, 1)))
	if !slices.Equal(v, plain) {
		t.Fatal("QuantizeResidual codes differ from Quantize's")
	}
	for i, r := range res {
		if !(float64(abs32(r)) < q.Step()*1.0001) {
			t.Fatalf("residual %d = %v, beyond one step %v", i, r, q.Step())
		}
	}
	if _, err := q.QuantizeResidual(x, 1, rand.New(rand.NewPCG(1, 1)), make([]float32, 2)); !errors.Is(err, secagg.ErrConfig) {
		t.Fatalf("short residual: %v", err)
	}
}

func abs32(x float32) float32 {
	if x < 0 {
		return -x
	}
	return x
}

// FuzzUnpack: any bytes either unpack into dim values below 2^bits that
// pack back to the same bytes, or are refused with ErrMalformed.
func FuzzUnpack(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4}, uint8(8), uint16(4))
	f.Add([]byte{1, 2, 3}, uint8(12), uint16(2))
	f.Fuzz(func(t *testing.T, b []byte, bits uint8, dim uint16) {
		m := &pb.MaskedUpdate{Bits: uint32(bits), Packed: slices.Clone(b)}
		if err := secagg.Unpack(m, int(bits), int(dim)); err != nil {
			if !errors.Is(err, secagg.ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		if len(b) == 0 {
			return // nothing packed: left for the values check
		}
		if len(m.Values) != int(dim) {
			t.Fatalf("%d values, want %d", len(m.Values), dim)
		}
		if err := secagg.Pack(m); err != nil || !slices.Equal(m.Packed, b) {
			t.Fatalf("accepted %x but packs back as %x (%v)", b, m.Packed, err)
		}
	})
}
