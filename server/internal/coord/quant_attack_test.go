package coord

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/fleetlearn/fleetlearn/aggregator/quant"
	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/floats"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
)

// quantEncoding is one of the two quantized update encodings, with what a
// hand-built encoding of it needs.
type quantEncoding struct {
	name    string
	enc     pb.UpdateEncoding
	bits    int
	magic   string
	maxCode int8
}

var quantEncodings = []quantEncoding{
	{"int8", pb.UpdateEncoding_UPDATE_ENCODING_INT8, 8, "FLQ8", 127},
	{"int4", pb.UpdateEncoding_UPDATE_ENCODING_INT4, 4, "FLQ4", 7},
}

// raw hand-builds an encoding of codes in one block with the given scale
// bits and declared length: whatever a hostile device likes.
func (q quantEncoding) raw(n uint32, scale uint32, codes []int8) []byte {
	b := append([]byte(q.magic), 1)
	b = binary.LittleEndian.AppendUint32(b, n)
	b = binary.LittleEndian.AppendUint32(b, uint32(quant.DefaultBlock))
	b = binary.LittleEndian.AppendUint32(b, scale)
	if q.bits == 8 {
		for _, c := range codes {
			b = append(b, byte(c))
		}
		return b
	}
	for i := 0; i < len(codes); i += 2 {
		lo, hi := byte(codes[i])&0xf, byte(0)
		if i+1 < len(codes) {
			hi = byte(codes[i+1]) & 0xf
		}
		b = append(b, lo|hi<<4)
	}
	return b
}

// encode quantizes delta as an honest device does.
func (q quantEncoding) encode(t *testing.T, delta []float32) []byte {
	t.Helper()
	b, _, err := quant.Encode(delta, q.bits, quant.DefaultBlock, rand.NewPCG(1, 2))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// sendQuantized publishes d's signed report carrying body as q's payload,
// under message id id.
func (d *device) sendQuantized(plan *pb.RoundPlan, q quantEncoding, body []byte, examples uint64, id string) {
	d.h.t.Helper()
	rep := d.signedUpdate(plan, make([]float32, 8), examples, nil)
	rep.Payload = &pb.UpdateReport_Quantized{Quantized: &pb.QuantizedUpdate{Encoding: q.enc, Data: body, Layout: rep.GetDense().GetLayout()}}
	rep.PayloadSha256 = wire.SHA256(body)
	sig, err := identity.SignReport(d.key, identity.UpdateStatement(rep))
	if err != nil {
		d.h.t.Fatal(err)
	}
	rep.Signature = sig
	d.publish(wire.ReportSubject(rep.TaskId, rep.Round, d.id), rep, id)
}

// TestQuantizedPoisonRefused: in int8 and int4 tasks an enrolled device
// sends signed updates whose scales, codes and lengths are chosen to escape
// the norm bound or poison the sum: the largest scale the decoder accepts
// with every code at its maximum (values near 2^120), a 1e30 update
// quantized honestly, NaN, +Inf, −0 and 1e38 scales, the one code the
// quantizer never writes (−128, −8), nonzero codes under a zero scale and a
// declared length that is not the model's. The coordinator decodes each and
// then applies the same checks as to a float32 update: every one is refused
// with a receipt naming why, the bound ones by the same norm bound, and none
// touches the aggregate. A denormal scale decodes to finite, tiny values and
// is accepted as the harmless update it is; the round commits with the
// honest reports and a finite model.
func TestQuantizedPoisonRefused(t *testing.T) {
	for _, q := range quantEncodings {
		t.Run(q.name, func(t *testing.T) {
			h := newHarness(t)
			task := h.start(h.baseTask(func(t *pb.Task) { t.UpdateEncoding = q.enc }))
			ev := h.watch(task.Id)
			mallory, a, b := h.enroll("mallory", 5), h.enroll("dev-a", 5), h.enroll("dev-b", 5)
			plan := mallory.join()
			codes := func(c int8) []int8 { return []int8{c, c, c, c, c, c, c, c} }
			one := math.Float32bits(1)
			for i, tc := range []struct {
				name string
				body []byte
				want []string
			}{
				{"largest scale, largest codes", q.encode(t, constant(8, quant.MaxAbs)), []string{"norm"}},
				{"1e30 honestly quantized", q.encode(t, constant(8, 1e30)), []string{"norm"}},
				{"NaN scale", q.raw(8, 0x7fc00000, codes(1)), []string{"scale 0 = NaN"}},
				{"+Inf scale", q.raw(8, 0x7f800000, codes(1)), []string{"scale 0 = +Inf"}},
				{"-0 scale", q.raw(8, 0x80000000, codes(0)), []string{"scale 0 = -0"}},
				{"1e38 scale", q.raw(8, math.Float32bits(1e38), codes(1)), []string{"scale 0 = 1e+38"}},
				{"code below -max", q.raw(8, one, codes(-q.maxCode-1)), []string{fmt.Sprintf("below -%d", q.maxCode)}},
				{"code under a zero scale", q.raw(8, 0, codes(1)), []string{"in a block of scale 0"}},
				{"longer than the model", q.raw(9, one, append(codes(0), 0)), []string{"9 values, want 8"}},
				{"shorter than the model", q.raw(7, one, codes(0)[:7]), []string{"7 values, want 8"}},
			} {
				mallory.sendQuantized(plan, q, tc.body, 5, fmt.Sprintf("attack-%d", i))
				if r := mallory.receipt(); r.Accepted || !containsAll(r.Reason, tc.want...) {
					t.Fatalf("%s: receipt %v, want refused naming %q", tc.name, r, tc.want)
				}
			}
			// The smallest denormal scale: finite values of about 1e-43.
			mallory.sendQuantized(plan, q, q.raw(8, 1, codes(q.maxCode)), 5, "denormal")
			if r := mallory.receipt(); !r.Accepted {
				t.Fatalf("denormal scale: %v", r)
			}
			for _, d := range []*device{a, b} {
				d.sendQuantized(d.join(), q, q.encode(t, constant(8, 0.1)), 5, "honest-"+d.id)
				if r := d.receipt(); !r.Accepted {
					t.Fatalf("%s: %v", d.id, r)
				}
			}
			got := h.next(ev)
			if got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED || got.Reported != 3 {
				t.Fatalf("round: %v", got)
			}
			// (tiny + 0.1 + 0.1)/3 on a model whose first value is 1.
			m := h.current(task.Id).Flatten()
			if i := floats.FirstNonFinite(m); i >= 0 || math.Abs(float64(m[0])-(1+0.2/3)) > 1e-6 {
				t.Fatalf("model after the attack: %v", m)
			}
		})
	}
}
