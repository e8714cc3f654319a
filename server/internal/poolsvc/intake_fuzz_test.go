package poolsvc

import (
	"encoding/binary"
	"math"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetlearn/fleetlearn/aggregator/quant"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// refIntake is what the stream must accept: data decoded whole, by the
// whole-vector decoders, as n finite values.
func refIntake(int8 bool, n int, data []byte) ([]float32, bool) {
	if !int8 {
		if len(data) != 4*n {
			return nil, false
		}
		v := make([]float32, n)
		for i := range v {
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
			if math.IsNaN(float64(v[i])) || math.IsInf(float64(v[i]), 0) {
				return nil, false
			}
		}
		return v, true
	}
	q, err := quant.Decode(data, n)
	// The streaming decoder holds the scales while the codes pass, so it
	// takes blocks of MinStreamBlock values at least.
	if err != nil || binary.LittleEndian.Uint32(data[9:]) < quant.MinStreamBlock {
		return nil, false
	}
	return q.Dequantize(), true
}

// FuzzIntake feeds a contribution stream, float32 or FLQ8, cut into chunks
// by plan (a byte at 0xC0 or above sends its chunk at a wrong offset), to
// the intake, and checks it against the whole-vector decoders: it accepts
// exactly the well-formed encodings sent in order, refuses everything else
// as INVALID_ARGUMENT, and what it spooled reads back, folded alone, as the
// values themselves, bit for bit.
func FuzzIntake(f *testing.F) {
	dir := f.TempDir()
	stop := make(chan struct{})
	f.Fuzz(func(t *testing.T, int8 bool, dimSeed uint16, plan, data []byte) {
		n := 1 + int(dimSeed)%512
		in, err := newIntake(intakeSpec{op: "fuzz", size: int64(len(data)), dim: n, int8: int8, weight: 1, spool: dir})
		want, ok := refIntake(int8, n, data)
		if err != nil {
			if status.Code(err) != codes.InvalidArgument || ok {
				t.Fatalf("intake of %d bytes refused at start: %v (whole decode ok: %t)", len(data), err, ok)
			}
			return
		}
		defer in.discard()
		inOrder := true
		var (
			off int
			sum [32]byte
		)
		refused := func() error {
			for i := 0; off < len(data); i++ {
				k, at := len(data)-off, int64(off)
				if i < len(plan) {
					k = min(k, 1+int(plan[i]&0x3f)*7)
					if plan[i] >= 0xc0 {
						at, inOrder = at+1, false
					}
				}
				if err := in.write(&pb.SyncChunk{Offset: at, Data: data[off : off+k]}); err != nil {
					return err
				}
				off += k
			}
			var err error
			sum, _, err = in.finish()
			return err
		}()
		if refused != nil {
			if status.Code(refused) != codes.InvalidArgument {
				t.Fatalf("refused as %v, want InvalidArgument", refused)
			}
			if ok && inOrder {
				t.Fatalf("refused a well-formed contribution sent in order: %v", refused)
			}
			return
		}
		if !ok || !inOrder {
			t.Fatalf("accepted %d bytes the whole decoders refuse (in order: %t)", len(data), inOrder)
		}
		h := newContributionHash(1)
		h.Write(data)
		if [32]byte(h.Sum(nil)) != sum {
			t.Fatal("the intake's digest is not the SHA-256 of the weight and the bytes")
		}
		got, err := foldSpools(n, int8, []spooled{{path: in.path, size: int64(len(data)), sum: sum, weight: 1}}, []float64{1}, stop)
		if err != nil {
			t.Fatalf("folding the accepted contribution: %v", err)
		}
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("value %d folds to %v, decodes to %v", i, got[i], want[i])
			}
		}
	})
}

// TestIntakeRefusesAnOversizedChunk: a chunk over MaxSyncChunkBytes is
// refused whatever it holds.
func TestIntakeRefusesAnOversizedChunk(t *testing.T) {
	in, err := newIntake(intakeSpec{op: "test", size: 2 * MaxSyncChunkBytes, dim: MaxSyncChunkBytes / 2, weight: 1})
	if err != nil {
		t.Fatal(err)
	}
	err = in.write(&pb.SyncChunk{Data: make([]byte, MaxSyncChunkBytes+4)})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "at most 4194304") {
		t.Fatalf("oversized chunk: %v", err)
	}
}
