package remote

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// FuzzFloatReceiver feeds a server's answer, cut into chunks by plan (a
// byte at 0xC0 or above sends its chunk at a wrong offset), to the
// receiver of n parameters: it takes exactly 4n bytes of finite float32
// sent in order, as they decode whole, and refuses anything else as
// ErrBadResponse.
func FuzzFloatReceiver(f *testing.F) {
	f.Fuzz(func(t *testing.T, dimSeed uint16, plan, data []byte) {
		n := 1 + int(dimSeed)%512
		out := make([]float32, n)
		rx := newFloatReceiver(out)
		inOrder := true
		err := func() error {
			for i, off := 0, 0; off < len(data); i++ {
				k, at := len(data)-off, int64(off)
				if i < len(plan) {
					k = min(k, 1+int(plan[i]&0x3f)*7)
					if plan[i] >= 0xc0 {
						at, inOrder = at+1, false
					}
				}
				if err := rx.write(&pb.SyncChunk{Offset: at, Data: data[off : off+k]}); err != nil {
					return err
				}
				off += k
			}
			return rx.close()
		}()
		ok := len(data) == 4*n && inOrder
		for i := 0; ok && i < n; i++ {
			v := math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
			ok = !math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0)
		}
		if err != nil {
			if !errors.Is(err, ErrBadResponse) || ok {
				t.Fatalf("refused %d bytes for %d parameters: %v (well-formed: %t)", len(data), n, err, ok)
			}
			return
		}
		if !ok {
			t.Fatalf("accepted %d bytes for %d parameters (in order: %t)", len(data), n, inOrder)
		}
		for i, v := range out {
			if math.Float32bits(v) != binary.LittleEndian.Uint32(data[4*i:]) {
				t.Fatalf("parameter %d is %v, the answer said %v", i, v, math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:])))
			}
		}
	})
}
