package kernel

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"
)

// FuzzGemm drives Gemm the way a WASM module can: any shapes, transposes,
// alpha, beta and operand lengths. A product whose shapes do not fit must be
// refused with ErrShape and leave C alone; one that fits must give the
// reference's exact bits on every kernel.
func FuzzGemm(f *testing.F) {
	f.Add([]byte{3, 4, 5, 0, 0, 0, 0, 0})
	f.Add([]byte{13, 35, 40, 1, 1, 2, 3, 1, 9, 9})
	f.Add([]byte{1, 33, 1, 0, 1, 0, 1, 0})
	f.Add([]byte{40, 1, 17, 1, 0, 1, 0, 3, 5})
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) < 8 {
			return
		}
		m, n, k := int(in[0]%48), int(in[1]%48), int(in[2]%48)
		transA, transB := in[3]&1 == 1, in[4]&1 == 1
		alpha := []float32{1, -1, 0.5, 0, 3}[int(in[5])%5]
		beta := []float32{0, 1, -0.25, 2}[int(in[6])%4]
		// in[7] shrinks or grows one operand, so that mismatched shapes and
		// short data are exercised too.
		bad := int(in[7] % 8)
		ar, ac := m, k
		if transA {
			ar, ac = ac, ar
		}
		br, bc := k, n
		if transB {
			br, bc = bc, br
		}
		cr, cc := m, n
		switch bad {
		case 1:
			ac++
		case 2:
			br++
		case 3:
			cc++
		}
		vals := func(seed int, n int) []float32 {
			v := make([]float32, n)
			for i := range v {
				var b [4]byte
				for j := range b {
					b[j] = in[(seed+4*i+j)%len(in)] ^ byte(i*7+j)
				}
				x := math.Float32frombits(binary.LittleEndian.Uint32(b[:]))
				if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) || math.Abs(float64(x)) > 1e18 {
					x = float32(int8(b[0])) / 16
				}
				v[i] = x
			}
			return v
		}
		a := Mat{Rows: ar, Cols: ac, Data: vals(1, ar*ac)}
		b := Mat{Rows: br, Cols: bc, Data: vals(2, br*bc)}
		c0 := vals(3, cr*cc)
		if bad == 4 && len(a.Data) > 0 {
			a.Data = a.Data[:len(a.Data)-1]
		}
		fits := bad < 1 || bad > 4 || (bad == 4 && ar*ac == 0)
		var want []float32
		if fits {
			want = append([]float32(nil), c0...)
			refGemm(transA, transB, m, n, k, alpha, a.Data, ac, b.Data, bc, beta, want, cc)
		}
		for ki := range kernels {
			c := Mat{Rows: cr, Cols: cc, Data: append([]float32(nil), c0...)}
			var err error
			withKernel(t, ki, func() { err = Gemm(transA, transB, alpha, a, b, beta, c) })
			if !fits {
				if !errors.Is(err, ErrShape) {
					t.Fatalf("%s: mismatched operands: err %v, want ErrShape", kernels[ki].name, err)
				}
				for i := range c0 {
					if math.Float32bits(c.Data[i]) != math.Float32bits(c0[i]) {
						t.Fatalf("%s: refused product wrote C[%d]", kernels[ki].name, i)
					}
				}
				continue
			}
			if err != nil {
				t.Fatalf("%s: %v", kernels[ki].name, err)
			}
			for i := range want {
				if math.Float32bits(c.Data[i]) != math.Float32bits(want[i]) {
					t.Fatalf("%s: C[%d] = %g, reference %g", kernels[ki].name, i, c.Data[i], want[i])
				}
			}
		}
	})
}
