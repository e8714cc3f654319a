package coord

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetlearn/fleetlearn/aggregator"
	"github.com/fleetlearn/fleetlearn/aggregator/quant"
	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/model"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/round"
	"github.com/fleetlearn/fleetlearn/server/internal/metrics"
)

// Plaintext update intake (docs/PROTOCOL.md, Reports). An update folds into
// the round's sum as its bytes arrive: the server never holds a whole
// report, chunked or not, nor a whole decoded update. It reads the report
// twice. The first pass splits off the payload (wire.ScanUpdate), hashes
// it, decodes it and checks the values (aggregator.Check: finite, norm);
// only once the rest of the report, its signature and its hashes have
// passed too does the second pass decode the values again into the sum
// (aggregator.Part). A chunked report's chunks are read from the stream in
// each pass, checked again, and each pass holds one chunk and one batch of
// values: the cost of never holding the report is decoding it twice.

// updateIntake is what reading a round's plaintext update reports needs:
// the round's terms and a reader of the stream's stored chunks, nothing of
// the runner's state. The leader builds one from its task (taskRun.intake)
// and an aggregation worker from the leader's dispatch (shard.go), so both
// read reports with this one implementation.
type updateIntake struct {
	spec      round.Spec
	encoding  pb.UpdateEncoding
	layout    model.Layout
	trained   []round.Tensor
	influence round.Influence
	maxReport uint64 // the largest report the round admits (maxReportBytes)
	// enrollment: a report must be signed with the key its device enrolled.
	enrollment bool
	// adaptive: the round clips adaptively, and a report carries its bit.
	adaptive bool
	read     chunkReader
	// kept holds a one-message report's values between its check and its
	// add, reused from report to report by its one reader.
	kept *[]float32
}

// intake is the update intake of round r.
func (t *taskRun) intake(r *roundRun) *updateIntake {
	return &updateIntake{spec: t.roundSpec(r), encoding: t.spec.GetUpdateEncoding(), layout: t.ulayout, trained: t.trained,
		influence: t.influence(), maxReport: t.maxReportBytes(r), enrollment: t.c.d.RequireEnrollment,
		adaptive: t.adaptive(), read: t.readStored, kept: &t.kept}
}

// reportMsg is a stored report message: one the round's consumer delivered
// (jetstream.Msg) or one read by its sequence (rawMsg).
type reportMsg interface {
	Subject() string
	Headers() nats.Header
	Data() []byte
}

// rawMsg is a report message read from the stream by sequence.
type rawMsg struct{ m *jetstream.RawStreamMsg }

func (r rawMsg) Subject() string      { return r.m.Subject }
func (r rawMsg) Headers() nats.Header { return r.m.Header }
func (r rawMsg) Data() []byte         { return r.m.Data }

// pieces returns a report's bytes, piece by piece: the message's own, or
// its chunks, read and checked one at a time (chunkStream).
//
// A read after the first (again) skips the report's sha256: stored
// messages do not change, and its device's cannot be purged while it is
// read (afterRead), so the bytes are those the first read checked. Every
// other check of the chunks still runs.
func (in *updateIntake) pieces(device string, m reportMsg, again bool) (next func() ([]byte, error), err error) {
	defer classify(&err, metrics.RefusedChunks)
	if !isChunked(m) {
		return onePiece(m.Data()), nil
	}
	if err := checkChunkedHeader(m); err != nil {
		return nil, err
	}
	cs, err := openChunks(m.Data(), in.maxReport, in.spec.Task, in.spec.Round, device, in.read)
	if err != nil {
		return nil, err
	}
	if again {
		cs.h = nil
	}
	return func() ([]byte, error) {
		b, err := cs.next()
		if err != nil && err != io.EOF {
			classify(&err, metrics.RefusedChunks)
		}
		return b, err
	}, nil
}

// reportPieces is pieces for round r of the task.
func (t *taskRun) reportPieces(r *roundRun, device string, m reportMsg, again bool) (func() ([]byte, error), error) {
	return t.intake(r).pieces(device, m, again)
}

// keepValues bounds the decoded values the first read of a one-message
// report keeps for the add: 8 MiB of float32, the size of the largest
// message, whatever the update's encoding.
const keepValues = wire.MaxMessageBytes / 4

func isChunked(m reportMsg) bool {
	_, chunked := m.Headers()[wire.HeaderChunked]
	return chunked
}

// chargeChunkedBytes counts the n bytes a chunked report's chunks held
// (settle counted its manifest).
func (c *Coordinator) chargeChunkedBytes(m reportMsg, n int) {
	if isChunked(m) {
		c.d.Metrics.ReportBytes.Add(float64(n))
	}
}

// payloadSpec is what the round's updates must be: which field carries the
// values, and for quantized ones the code width.
func (in *updateIntake) payloadSpec(f wire.PayloadField) (bits int, refused error) {
	bits, ok := wire.EncodingBits(in.encoding)
	if !ok {
		return 0, refuseAs(metrics.RefusedPayload, "task %s's update encoding %v is unknown to this server", in.spec.Task, in.encoding)
	}
	return bits, fromRound(round.CheckForm(in.spec.Task, in.spec.Round, bits, formOf(f)))
}

// formOf is how a payload field carries an update's values.
func formOf(f wire.PayloadField) round.Form {
	switch f {
	case wire.DenseValues:
		return round.FormDense
	case wire.QuantizedData:
		return round.FormQuantized
	case wire.MaskedValues, wire.MaskedPacked:
		return round.FormMasked
	}
	return round.FormNone
}

// valueDecoder is a streaming decoder of an update's values.
type valueDecoder interface {
	Write([]byte) error
	Close() error
}

// newValueDecoder decodes size bytes of payload into n values for emit.
func newValueDecoder(bits, n int, size uint64, emit func([]float32) error) (valueDecoder, error) {
	if bits == 0 {
		return wire.NewDenseDecoder(n, emit), nil
	}
	return quant.NewDecoder(bits, n, size, emit)
}

// scanPass is one reading of an update report: the payload's values go to
// emit, and the payload's sha256 is taken.
type scanPass struct {
	in   *updateIntake
	emit func([]float32) error
	dec  valueDecoder
	h    hash.Hash
	n    int
	bad  error // the payload's decoding error, reported after the other checks
	// again: a second read of a report the first read checked, whose
	// payload is not hashed again (reportPieces).
	again bool
}

func (p *scanPass) open(f wire.PayloadField, size uint64) (func([]byte) error, error) {
	bits, err := p.in.payloadSpec(f)
	if err != nil {
		return nil, err
	}
	if !p.again {
		p.h = sha256.New()
	}
	if n := p.in.layout.Size(); bits == 0 && size != 4*uint64(n) {
		// As wire.DecodeDenseInto says it; refused after the other checks.
		p.bad = fmt.Errorf("%w: %d bytes for %d float32 values", wire.ErrPayload, size, n)
	} else if p.dec, err = newValueDecoder(bits, n, size, p.emit); err != nil {
		p.bad = err
	}
	return func(b []byte) error {
		if p.h != nil {
			p.h.Write(b)
		}
		if p.bad != nil {
			return nil
		}
		// A payload that does not decode is refused after the report's
		// other checks, whose messages (the wrong layout, say) say more.
		if err := p.dec.Write(b); err != nil {
			p.bad = err
			var r *refusal
			if errors.As(err, &r) {
				return err // emit's: the values decoded but were refused
			}
		}
		return nil
	}, nil
}

// scanReport runs wire.ScanUpdate over next, adding the bytes read to *n;
// malformed bytes are refused as "decode update report". The plaintext and
// masked reads share it.
func scanReport(next func() ([]byte, error), limit int, open func(wire.PayloadField, uint64) (func([]byte) error, error), n *int) (*pb.UpdateReport, wire.PayloadField, error) {
	rep, f, _, err := wire.ScanUpdate(func() ([]byte, error) {
		b, err := next()
		*n += len(b)
		return b, err
	}, limit, open)
	if errors.Is(err, wire.ErrScan) {
		return nil, f, refuse("decode update report: %v", err)
	}
	return rep, f, err
}

// run scans the report's bytes from next; the report comes back without
// its values.
func (p *scanPass) run(next func() ([]byte, error)) (rep *pb.UpdateReport, sha string, err error) {
	limit := reportOverhead + tensorOverhead*len(p.in.layout.Entries)
	rep, f, err := scanReport(next, limit, p.open, &p.n)
	if err != nil {
		classify(&err, refusedDecode)
		return nil, "", err
	}
	if f == wire.NoPayload {
		_, err := p.in.payloadSpec(f)
		return nil, "", err
	}
	if p.h == nil {
		return rep, rep.PayloadSha256, nil // again: checked by the first read
	}
	return rep, hex.EncodeToString(p.h.Sum(nil)), nil
}

// checkPayload runs the pass and checks the payload against the report:
// its sha256, and the layout against the trained tensors. It is the pure
// part of the intake, with no I/O but next.
func (p *scanPass) checkPayload(next func() ([]byte, error)) (*pb.UpdateReport, error) {
	rep, sha, err := p.run(next)
	if err != nil {
		return nil, err
	}
	return rep, p.finish(rep, sha)
}

// finish checks the payload of the report run returned against it.
func (p *scanPass) finish(rep *pb.UpdateReport, sha string) error {
	if q := rep.GetQuantized(); q != nil {
		sent, ok := wire.EncodingBits(q.GetEncoding())
		if !ok {
			return refuseAs(metrics.RefusedPayload, "update declares encoding %v, unknown to this server", q.GetEncoding())
		}
		bits, _ := wire.EncodingBits(p.in.encoding)
		if err := round.CheckQuantized(p.in.spec.Task, bits, sent); err != nil {
			return fromRound(err)
		}
	}
	if err := round.CheckDigest(sha, rep.PayloadSha256); err != nil {
		return fromRound(err)
	}
	if err := p.in.checkLayout(rep); err != nil {
		return err
	}
	if p.bad == nil && p.dec != nil {
		p.bad = p.dec.Close()
	}
	if p.bad != nil {
		var r *refusal
		if errors.As(p.bad, &r) {
			return p.bad
		}
		return refuseAs(metrics.RefusedPayload, "%v", p.bad)
	}
	return nil
}

// onePiece is a next function over one message's bytes.
func onePiece(b []byte) func() ([]byte, error) {
	done := false
	return func() ([]byte, error) {
		if done {
			return nil, io.EOF
		}
		done = true
		return b, nil
	}
}

// acceptUpdate checks a plaintext update report and folds it into col.
func (t *taskRun) acceptUpdate(r *roundRun, col aggregator.Collector, mm *metricMean, m jetstream.Msg) (string, error) {
	device, seat, key, err := t.sender(r, m.Subject(), round.Train)
	if err != nil {
		return device, err
	}
	// The device's stored messages stay until both passes are done: a
	// purge between them (its quota, a newer attempt) would leave the sum
	// with part of its update.
	t.startReading(device)
	defer t.stopReading(device)
	got, err := t.intake(r).fold(device, seat, key, m, col.Begin)
	t.c.chargeChunkedBytes(m, got.chunked)
	if err != nil {
		if errors.Is(err, errPartlyAdded) {
			r.lost = fmt.Sprintf("the sum holds part of the update of %s: %v", device, err)
		}
		return device, err
	}
	mm.add(got.metrics, got.weight)
	r.noteClipBit(device, got.clip)
	t.mu.Lock()
	r.cohort.Report(device)
	t.mu.Unlock()
	return device, nil
}

// errPartlyAdded: a report passed every check, but its second read failed
// with part of its values in the sum.
var errPartlyAdded = errors.New("the report could not be read again")

// folded is what a report that fold added brings the round besides its values.
type folded struct {
	metrics map[string]float64
	weight  float64
	chunked int        // the bytes its chunks held, read in the first pass
	clip    pb.ClipBit // its adaptive clipping bit
}

// fold checks a plaintext update report of device, which holds seat and
// signs with key, and adds its values through a Part begin gives. A refused
// report has touched nothing; an error wrapping errPartlyAdded has left
// part of the update in the sum.
func (in *updateIntake) fold(device string, seat round.Seat, key ed25519.PublicKey, m reportMsg,
	begin func(weight float64) (aggregator.Part, error)) (got folded, err error) {
	next, err := in.pieces(device, m, false)
	if err != nil {
		return got, err
	}
	check, err := aggregator.NewCheck(in.layout.Size(), 0)
	if err != nil {
		return got, err
	}
	// A report in one message is in memory already: for updates of up to
	// keepValues values, the first read keeps what it decoded and the add
	// uses that instead of decoding the message again.
	var kept []float32
	keep := !isChunked(m) && in.layout.Size() <= keepValues
	if keep {
		kept = (*in.kept)[:0]
	}
	first := &scanPass{in: in, emit: func(v []float32) error {
		if err := check.Write(v); err != nil {
			return refuseAs(metrics.RefusedPayload, "%v", err)
		}
		if keep {
			kept = append(kept, v...)
		}
		return nil
	}}
	rep, sha, err := first.run(next)
	if isChunked(m) {
		got.chunked = first.n
	}
	if err != nil {
		return got, err
	}
	if err := in.checkHeader(device, rep.TaskId, rep.Round, rep.DeviceId, rep.ModelVersion, rep.ModuleSha256); err != nil {
		return got, err
	}
	if err := in.checkClipBit(rep.ClipBit); err != nil {
		return got, err
	}
	if err := in.checkSignature(key, rep.Signature, rep.KeyId, identity.UpdateStatement(rep)); err != nil {
		return got, err
	}
	if err := first.finish(rep, sha); err != nil {
		return got, err
	}
	if err := checkMetrics(rep.GetMetrics().GetValues()); err != nil {
		return got, err
	}
	if err := checkExamples(rep.NumExamples, seat); err != nil {
		return got, err
	}
	if err := check.Close(); err != nil {
		return got, refuseAs(refusedAggregate, "%v", err)
	}
	if err := round.CheckNorm(check.Norm(), in.influence.NormBound()); err != nil {
		return got, fromRound(err)
	}
	got.weight = in.influence.Weight(rep.NumExamples)
	part, err := begin(got.weight)
	if err != nil {
		return got, refuseAs(refusedAggregate, "%v", err)
	}
	// Last: a refused report must not have touched the aggregate. The
	// second pass reads what the first accepted; it fails only if the
	// stream does, and then the sum holds part of an update.
	if keep {
		*in.kept = kept[:0]
		if err = part.Write(kept); err == nil {
			err = part.Close()
		}
	} else if next, err = in.pieces(device, m, true); err == nil {
		second := &scanPass{in: in, emit: part.Write, again: true}
		if _, err = second.checkPayload(next); err == nil {
			err = part.Close()
		}
	}
	if err != nil {
		return got, fmt.Errorf("%w: %v", errPartlyAdded, err)
	}
	got.metrics, got.clip = rep.GetMetrics().GetValues(), rep.ClipBit
	return got, nil
}

// checkClipBit refuses a report without the bit its round's adaptive
// clipping needs, with one its round does not use, or with an unknown one.
// The bit is the device's word, like its update: it moves the bound by one
// device's share at most, as much as under secure aggregation, where no
// one can check it.
func (in *updateIntake) checkClipBit(bit pb.ClipBit) error {
	switch {
	case in.adaptive && bit != pb.ClipBit_CLIP_BIT_UNCLIPPED && bit != pb.ClipBit_CLIP_BIT_CLIPPED:
		return refuseAs(metrics.RefusedPayload, "the round clips adaptively and the report carries no clip bit (%v); update the agent", bit)
	case !in.adaptive && bit != pb.ClipBit_CLIP_BIT_UNSPECIFIED:
		return refuseAs(metrics.RefusedPayload, "a clip bit (%v) in a round without adaptive clipping", bit)
	}
	return nil
}

// checkLayout checks an update's tensor layout against the trained tensors.
func (in *updateIntake) checkLayout(rep *pb.UpdateReport) error {
	var layout []*pb.TensorSpec
	switch p := rep.Payload.(type) {
	case *pb.UpdateReport_Dense:
		layout = p.Dense.GetLayout()
	case *pb.UpdateReport_Quantized:
		layout = p.Quantized.GetLayout()
	}
	got := make([]round.Tensor, len(layout))
	for i, s := range layout {
		got[i] = round.Tensor{Name: s.GetName(), Shape: s.GetShape()}
	}
	return fromRound(round.CheckLayout(in.trained, got))
}
