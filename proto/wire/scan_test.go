package wire_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
)

// pieces returns a next function over b cut at random points, empty pieces
// among them.
func pieces(rng *rand.Rand, b []byte) func() ([]byte, error) {
	return func() ([]byte, error) {
		if len(b) == 0 {
			return nil, io.EOF
		}
		n := rng.IntN(min(len(b), 9) + 1)
		p := b[:n]
		b = b[n:]
		return p, nil
	}
}

// scanWhole scans b and puts the payload back into the report it returns.
func scanWhole(t testing.TB, rng *rand.Rand, b []byte, limit int) (*pb.UpdateReport, error) {
	var payload []byte
	rep, field, size, err := wire.ScanUpdate(pieces(rng, b), limit, func(wire.PayloadField, uint64) (func([]byte) error, error) {
		return func(p []byte) error {
			if len(p) == 0 {
				t.Fatal("empty payload piece")
			}
			payload = append(payload, p...)
			return nil
		}, nil
	})
	if err != nil {
		return nil, err
	}
	if uint64(len(payload)) != size {
		t.Fatalf("payload %d bytes, size says %d", len(payload), size)
	}
	if payload == nil {
		payload = []byte{}
	}
	switch field {
	case wire.DenseValues:
		rep.GetDense().Values = payload
	case wire.QuantizedData:
		rep.GetQuantized().Data = payload
	case wire.MaskedPacked:
		rep.GetMasked().Packed = payload
	case wire.MaskedValues:
		var m pb.MaskedUpdate
		raw := protowire.AppendBytes(protowire.AppendTag(nil, 3, protowire.BytesType), payload)
		if err := proto.Unmarshal(raw, &m); err != nil {
			// Packed fixed32s of a length not a multiple of 4: the scan
			// passes the bytes on, and their decoder refuses them.
			return nil, fmt.Errorf("%w: %v", wire.ErrScan, err)
		}
		rep.GetMasked().Values = m.Values
	}
	return rep, nil
}

func reports() []*pb.UpdateReport {
	head := func() *pb.UpdateReport {
		return &pb.UpdateReport{TaskId: "t", Round: 3, DeviceId: "d", ModelVersion: "m", ModuleSha256: "x",
			NumExamples: 7, Metrics: &pb.Metrics{Values: map[string]float64{"loss": 0.5}}, PayloadSha256: "ab",
			Signature: []byte{1, 2, 3}, KeyId: "k"}
	}
	layout := []*pb.TensorSpec{{Name: "w", Shape: []uint64{2, 3}}, {Name: "b", Shape: []uint64{3}}}
	var out []*pb.UpdateReport
	r := head()
	r.Payload = &pb.UpdateReport_Dense{Dense: &pb.DenseUpdate{Values: bytes.Repeat([]byte{1, 2, 3, 4}, 9), Layout: layout}}
	out = append(out, r)
	r = head()
	r.Payload = &pb.UpdateReport_Quantized{Quantized: &pb.QuantizedUpdate{Encoding: pb.UpdateEncoding_UPDATE_ENCODING_INT8, Data: []byte("FLQ8 and codes"), Layout: layout}}
	out = append(out, r)
	r = head()
	r.Payload = &pb.UpdateReport_Masked{Masked: &pb.MaskedUpdate{ParticipantId: 4, Bits: 20, Values: []uint32{1, 2, 1 << 19, 7}}}
	out = append(out, r)
	r = head()
	r.Payload = &pb.UpdateReport_Masked{Masked: &pb.MaskedUpdate{ParticipantId: 4, Bits: 16, Packed: []byte{1, 2, 3, 4, 5, 6}}}
	out = append(out, r)
	r = head()
	r.Payload = &pb.UpdateReport_Dense{Dense: &pb.DenseUpdate{Layout: layout}} // no values
	out = append(out, r)
	out = append(out, head()) // no payload
	return out
}

// TestScanUpdateMatchesUnmarshal: every report Marshal writes scans, cut
// anywhere, to the message Unmarshal reads.
func TestScanUpdateMatchesUnmarshal(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for i, want := range reports() {
		b, err := proto.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		for range 50 {
			got, err := scanWhole(t, rng, b, 1<<10)
			if err != nil {
				t.Fatalf("report %d: %v", i, err)
			}
			var ref pb.UpdateReport
			if err := proto.Unmarshal(b, &ref); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, &ref) {
				t.Fatalf("report %d: scanned %v\nunmarshaled %v", i, got, &ref)
			}
		}
	}
}

func TestScanUpdateRefuses(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	dense, _ := proto.Marshal(reports()[0])
	masked, _ := proto.Marshal(reports()[2])
	unpacked := protowire.AppendTag(nil, 9, protowire.BytesType)
	inner := protowire.AppendTag(nil, 3, protowire.Fixed32Type)
	inner = protowire.AppendFixed32(inner, 5)
	unpacked = protowire.AppendBytes(unpacked, inner)
	twoFields := protowire.AppendTag(nil, 8, protowire.BytesType)
	in2 := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), []byte{0, 0, 0, 0})
	in2 = append(in2, in2...)
	twoFields = protowire.AppendBytes(twoFields, in2)
	for _, c := range []struct {
		name  string
		b     []byte
		limit int
	}{
		{"two payload messages", append(append([]byte{}, dense...), masked...), 1 << 10},
		{"values twice in one message", twoFields, 1 << 10},
		{"unpacked masked values", unpacked, 1 << 10},
		{"truncated", dense[:len(dense)-3], 1 << 10},
		{"over the limit besides the payload", dense, 20},
		{"unterminated group", protowire.AppendTag(nil, 1, protowire.StartGroupType), 1 << 10},
		{"end of group without a start", protowire.AppendTag(nil, 1, protowire.EndGroupType), 1 << 10},
		{"field number 0", []byte{0x02, 0x00}, 1 << 10},
		{"overlong varint", bytes.Repeat([]byte{0xff}, 11), 1 << 10},
	} {
		if _, err := scanWhole(t, rng, c.b, c.limit); !errors.Is(err, wire.ErrScan) {
			t.Errorf("%s: %v, want ErrScan", c.name, err)
		}
	}
}

// TestScanUpdateStopsOnCallerErrors: errors of next and of the payload
// function come back as they are.
func TestScanUpdateStopsOnCallerErrors(t *testing.T) {
	b, _ := proto.Marshal(reports()[0])
	boom := errors.New("boom")
	_, _, _, err := wire.ScanUpdate(pieces(rand.New(rand.NewPCG(1, 1)), b), 1<<10, func(wire.PayloadField, uint64) (func([]byte) error, error) {
		return func([]byte) error { return boom }, nil
	})
	if err != boom {
		t.Fatalf("payload error: %v", err)
	}
	_, _, _, err = wire.ScanUpdate(pieces(rand.New(rand.NewPCG(1, 1)), b), 1<<10, func(wire.PayloadField, uint64) (func([]byte) error, error) {
		return nil, boom
	})
	if err != boom {
		t.Fatalf("open error: %v", err)
	}
	calls := 0
	_, _, _, err = wire.ScanUpdate(func() ([]byte, error) {
		if calls++; calls > 3 {
			return nil, boom
		}
		return b[calls-1 : calls], nil
	}, 1<<10, func(wire.PayloadField, uint64) (func([]byte) error, error) {
		return func([]byte) error { return nil }, nil
	})
	if err != boom {
		t.Fatalf("next error: %v", err)
	}
}

func discardUnknown(m protoreflect.Message) {
	m.SetUnknown(nil)
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			for i := range v.List().Len() {
				discardUnknown(v.List().Get(i).Message())
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				discardUnknown(mv.Message())
				return true
			})
		case fd.Message() != nil && !fd.IsMap():
			discardUnknown(v.Message())
		}
		return true
	})
}

// FuzzScanUpdate: whatever the bytes, a scan that succeeds agrees with
// Unmarshal, and a report Unmarshal reads with at most one payload message
// and values field, packed, scans.
func FuzzScanUpdate(f *testing.F) {
	for _, r := range reports() {
		b, _ := proto.Marshal(r)
		f.Add(b, uint64(1))
	}
	f.Fuzz(func(t *testing.T, b []byte, seed uint64) {
		rng := rand.New(rand.NewPCG(seed, seed))
		got, err := scanWhole(t, rng, b, 1<<12)
		var ref pb.UpdateReport
		uerr := proto.Unmarshal(b, &ref)
		if err == nil {
			if uerr != nil {
				t.Fatalf("scan accepted what Unmarshal refuses: %v", uerr)
			}
			// Unknown fields are copied field by field, re-encoded minimally:
			// equal in meaning, not always in bytes, and the server reads
			// none of them.
			discardUnknown(got.ProtoReflect())
			discardUnknown(ref.ProtoReflect())
			if !proto.Equal(got, &ref) {
				t.Fatalf("scanned %v\nunmarshaled %v", got, &ref)
			}
			return
		}
		if !errors.Is(err, wire.ErrScan) {
			t.Fatalf("error without ErrScan: %v", err)
		}
		if uerr == nil {
			// Canonical re-encoding of what Unmarshal read must scan.
			canon, _ := proto.MarshalOptions{Deterministic: true}.Marshal(&ref)
			if _, err := scanWhole(t, rng, canon, 1<<12); err != nil && len(canon) <= 1<<12 {
				t.Fatalf("Marshal's bytes do not scan: %v", err)
			}
		}
	})
}

// TestDenseDecoderMatchesWhole: values cut anywhere decode as
// DecodeDenseInto decodes them, and what it refuses is refused.
func TestDenseDecoderMatchesWhole(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for _, n := range []int{1, 3, 4095, 4096, 4097, 10000} {
		b := make([]byte, 4*n)
		for i := range n {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(rng.NormFloat64())))
		}
		for trial := range 4 {
			c := slices.Clone(b)
			want := n
			switch trial {
			case 1:
				binary.LittleEndian.PutUint32(c[4*rng.IntN(n):], 0x7fc00000) // NaN
			case 2:
				c = c[:len(c)-1]
			case 3:
				want = n - 1
			}
			ref, rerr := wire.DecodeDenseInto(nil, c, want)
			var got []float32
			d := wire.NewDenseDecoder(want, func(v []float32) error { got = append(got, v...); return nil })
			var err error
			for next := pieces(rng, c); err == nil; {
				p, nerr := next()
				if nerr != nil {
					err = d.Close()
					break
				}
				err = d.Write(p)
			}
			if (rerr == nil) != (err == nil) || rerr == nil && !slices.Equal(ref, got) {
				t.Fatalf("n %d trial %d: whole %v, pieces %v", n, trial, rerr, err)
			}
			if err != nil && !errors.Is(err, wire.ErrPayload) {
				t.Fatalf("n %d trial %d: %v without ErrPayload", n, trial, err)
			}
		}
	}
}
