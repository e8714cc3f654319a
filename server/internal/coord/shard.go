package coord

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetlearn/fleetlearn/aggregator"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/round"
)

// Sharded aggregation (docs/HA.md, "Sharded aggregation"). With
// Deps.ShardAggregation, the leader of a plaintext training round whose rule
// streams does not read its update reports itself: it checks each report's
// sender against the cohort (sender), then hands the report's stream
// sequence to the aggregation workers' NATS queue group. The worker that
// takes it reads the report from the stream, checks it with the leader's
// code (updateIntake.fold) and adds it to its partial sum for the round; it
// answers accepted or refused, and the leader answers the device. When the
// round closes, the leader collects each worker's partial sum (its reports'
// sequences, count, weight and Σ wₖ·updateₖ) and combines them (AddSum).
//
// Nothing is lost when a worker is: a report whose dispatch goes
// unanswered (no worker, a worker gone) or that a worker could not read is
// read by the leader itself, and a partial sum that cannot be collected,
// or that does not hold exactly the reports the leader credited to its
// worker, is dropped and those reports are read again, from the stream, by
// the leader. Every decision stays the leader's; a worker only sums.
//
// The subjects are outside fl.>, which NATS tools may subscribe to: only
// the service user (the aggregators) may use them.
const (
	subjectShardWork    = "flsvc.agg.work"
	shardQueue          = "fleetlearn-aggregators"
	subjectShardCollect = "flsvc.agg.collect." // + worker id
	subjectShardDrop    = "flsvc.agg.drop"

	// shardInFlight bounds the reports out with workers at once: each
	// holds its message (up to 8 MiB) until answered.
	shardInFlight = 64
	// shardAnswerWait is how long a dispatch waits for its answer before
	// the leader reads the report itself. A late answer is ignored; the
	// worker's partial then does not match and is read again.
	shardAnswerWait = 30 * time.Second
	// shardPage bounds one page of a collected partial sum: 1 MiB of
	// float64s, well under NATS's message limit.
	shardPage = 1 << 17
)

// shardTerms are the round's terms an aggregation worker checks reports
// against: those of updateIntake, as the leader has them.
type shardTerms struct {
	Spec       round.Spec
	Encoding   pb.UpdateEncoding
	Trained    []round.Tensor
	Influence  round.Influence
	MaxReport  uint64
	Enrollment bool
	Adaptive   bool
}

// shardWork hands one report to the queue group.
type shardWork struct {
	Run      string // the leader's round run: the partial sum's key
	Seq      uint64 // the report's stream sequence
	Device   string
	Examples uint64 // the device's seat
	Key      []byte // its enrolled key (none when enrollment is off)
	Terms    shardTerms
}

// shardAnswer is a worker's answer to a shardWork.
type shardAnswer struct {
	Worker string
	// Refused is the report's refusal, with its metrics class; Failed says
	// why the worker did not decide, and the leader reads the report.
	Refused, Class, Failed string
	Metrics                map[string]float64
	Weight                 float64
	Chunked                int        // the bytes its chunks held
	Clip                   pb.ClipBit // the report's adaptive clipping bit
}

// shardCollect asks a worker for a page of its partial sum.
type shardCollect struct {
	Run  string
	From int
}

// shardPartialMeta heads each page of a partial sum; the float64 values
// follow it, little-endian.
type shardPartialMeta struct {
	Count  int
	Weight float64
	Seqs   []uint64 // on the first page
	Broken string   // set when the sum holds part of an update
	Dim    int
}

// shardRun is the leader's side of one round's sharded intake; the runner's
// goroutine alone uses it.
type shardRun struct {
	run     string
	answers chan shardReply
	pending map[uint64]*shardPending // by stream sequence
	out     map[string]bool          // devices with a report out
	// waiting are reports of devices with one out, handled once it is
	// answered (they are then refused as a second report, or read).
	waiting []jetstream.Msg
	// credited are the reports each worker added to its partial sum.
	credited map[string][]shardCredit
}

type shardPending struct {
	m      jetstream.Msg
	device string
	seat   round.Seat
}

type shardCredit struct {
	seq    uint64
	device string
	seat   round.Seat
}

type shardReply struct {
	seq    uint64
	answer shardAnswer
	err    error
}

// sharded reports whether round r's update reports go to the workers.
func (t *taskRun) sharded(r *roundRun) bool {
	return t.c.d.ShardAggregation && r.row.Kind == pb.RoundKind_ROUND_KIND_TRAIN && r.secure == nil &&
		t.rule.Kind().Streaming()
}

func newShardRun() *shardRun {
	var id [8]byte
	rand.Read(id[:])
	return &shardRun{run: hex.EncodeToString(id[:]), answers: make(chan shardReply, shardInFlight),
		pending: map[uint64]*shardPending{}, out: map[string]bool{}, credited: map[string][]shardCredit{}}
}

// room is msgs while fewer than shardInFlight reports are out, else nil.
func (sh *shardRun) room(msgs <-chan jetstream.Msg) <-chan jetstream.Msg {
	if sh != nil && len(sh.pending) >= shardInFlight {
		return nil
	}
	return msgs
}

// releaseShard ends the reads of reports still out when the runner stops,
// and tells the workers to drop the run's sums.
func (t *taskRun) releaseShard(sh *shardRun) {
	for _, p := range sh.pending {
		t.stopReading(p.device)
	}
	clear(sh.pending)
	t.dropShards(sh.run)
}

// dispatch hands an update report to the workers, or answers it when its
// sender is refused.
func (t *taskRun) dispatch(ctx context.Context, r *roundRun, col aggregator.Collector, mm *metricMean, m jetstream.Msg) {
	sh := r.shard
	device, seat, key, err := t.sender(r, m.Subject(), round.Train)
	if err != nil {
		t.settle(r, m, "update", func() (string, error) { return device, err })
		return
	}
	if sh.out[device] {
		// One waits per device: an honest device sends its report once
		// (a retry has the same message id, which the stream drops).
		if slices.ContainsFunc(sh.waiting, func(w jetstream.Msg) bool { return w.Subject() == m.Subject() }) {
			t.settle(r, m, "update", func() (string, error) {
				return device, refuse("another report of %s is being read: a device sends one report a round", device)
			})
			return
		}
		sh.waiting = append(sh.waiting, m)
		return
	}
	in := t.intake(r)
	md, err := m.Metadata()
	var work []byte
	if err == nil {
		work, err = json.Marshal(shardWork{Run: sh.run, Seq: md.Sequence.Stream, Device: device, Examples: seat.Examples, Key: key,
			Terms: shardTerms{Spec: in.spec, Encoding: in.encoding, Trained: in.trained, Influence: in.influence,
				MaxReport: in.maxReport, Enrollment: in.enrollment, Adaptive: in.adaptive}})
	}
	if err != nil {
		// Not a stream message: no worker could read it by sequence.
		t.settle(r, m, "update", func() (string, error) { return t.readUpdate(r, col, mm, m) })
		return
	}
	seq := md.Sequence.Stream
	// Its messages stay until the worker has read them (afterRead).
	t.startReading(device)
	sh.out[device] = true
	sh.pending[seq] = &shardPending{m: m, device: device, seat: seat}
	nc := t.c.d.NC
	go func() {
		actx, cancel := context.WithTimeout(ctx, shardAnswerWait)
		defer cancel()
		rep := shardReply{seq: seq}
		msg, err := nc.RequestWithContext(actx, subjectShardWork, work)
		if err == nil {
			err = json.Unmarshal(msg.Data, &rep.answer)
		}
		rep.err = err
		sh.answers <- rep // room for every report out
	}()
}

// settleShard takes a worker's answer (or the lack of one) to a report.
func (t *taskRun) settleShard(ctx context.Context, r *roundRun, col aggregator.Collector, mm *metricMean, rep shardReply) {
	sh := r.shard
	p := sh.pending[rep.seq]
	if p == nil {
		return
	}
	delete(sh.pending, rep.seq)
	delete(sh.out, p.device)
	t.stopReading(p.device)
	a := rep.answer
	switch {
	case rep.err != nil || a.Failed != "":
		why := a.Failed
		if rep.err != nil {
			why = rep.err.Error()
		}
		t.c.d.Metrics.ShardReports.WithLabelValues("leader").Inc()
		t.log().Debug("the leader reads a report itself", "round", r.row.Round, "device", p.device, "why", why)
		t.settle(r, p.m, "update", func() (string, error) { return t.readUpdate(r, col, mm, p.m) })
	default:
		t.c.d.Metrics.ShardReports.WithLabelValues("worker").Inc()
		t.settle(r, p.m, "update", func() (string, error) {
			t.c.chargeChunkedBytes(p.m, a.Chunked)
			if a.Refused != "" {
				return p.device, refuseAs(a.Class, "%s", a.Refused)
			}
			// The device's standing may have changed while the worker
			// read; then its worker's sum holds a report the leader does
			// not count, and is read again at collection.
			if _, _, _, err := t.sender(r, p.m.Subject(), round.Train); err != nil {
				return p.device, err
			}
			sh.credited[a.Worker] = append(sh.credited[a.Worker], shardCredit{seq: rep.seq, device: p.device, seat: p.seat})
			mm.add(a.Metrics, a.Weight)
			r.noteClipBit(p.device, a.Clip)
			t.mu.Lock()
			r.cohort.Report(p.device)
			t.mu.Unlock()
			return p.device, nil
		})
	}
	// Reports that waited on this device's: dispatched in order.
	waiting := sh.waiting
	sh.waiting = nil
	for _, m := range waiting {
		t.dispatch(ctx, r, col, mm, m)
	}
}

// readUpdate is acceptUpdate for a report the round's consumer delivered
// without its bytes: the leader reads them by sequence.
func (t *taskRun) readUpdate(r *roundRun, col aggregator.Collector, mm *metricMean, m jetstream.Msg) (string, error) {
	full, err := t.fullMsg(m)
	if err != nil {
		device, _, _, _ := t.sender(r, m.Subject(), round.Train)
		return device, err
	}
	return t.acceptUpdate(r, col, mm, full)
}

// fullMsg is m with its bytes: m itself, or, delivered headers only, m
// with the bytes read from the stream by its sequence.
func (t *taskRun) fullMsg(m jetstream.Msg) (jetstream.Msg, error) {
	if m.Headers().Get(nats.MsgSize) == "" {
		return m, nil
	}
	md, err := m.Metadata()
	if err != nil {
		return nil, fmt.Errorf("read report %s: %w", m.Subject(), err)
	}
	raw, err := t.readChunk(md.Sequence.Stream)
	if err != nil {
		return nil, fmt.Errorf("read report %s (stream sequence %d): %w", m.Subject(), md.Sequence.Stream, err)
	}
	return assembled{Msg: m, data: raw.Data}, nil
}

// storedSize is the bytes of a stored report message, delivered whole or
// headers only.
func storedSize(m reportMsg) int {
	if v := m.Headers().Get(nats.MsgSize); v != "" && len(m.Data()) == 0 {
		if n, err := strconv.Atoi(v); err == nil && n >= 0 {
			return n
		}
	}
	return len(m.Data())
}

// awaitShards takes the answers to every report out.
func (t *taskRun) awaitShards(ctx context.Context, r *roundRun, col aggregator.Collector, mm *metricMean) error {
	for sh := r.shard; sh != nil && len(sh.pending) > 0; {
		select {
		case rep := <-sh.answers:
			t.settleShard(ctx, r, col, mm, rep)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// gatherShards adds every worker's partial sum to col, or reads again the
// reports of a worker whose sum it cannot have. It fails only when a report
// a worker added can no longer be read: the sum would then lack it.
func (t *taskRun) gatherShards(ctx context.Context, r *roundRun, col aggregator.Collector) error {
	sh := r.shard
	workers := make([]string, 0, len(sh.credited))
	for w := range sh.credited {
		workers = append(workers, w)
	}
	slices.Sort(workers)
	for _, w := range workers {
		credits := sh.credited[w]
		err := t.collectShard(ctx, w, sh.run, credits, col)
		if err == nil {
			continue
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		t.c.d.Metrics.ShardRereads.Add(float64(len(credits)))
		t.log().Warn("reading again the reports an aggregation worker summed", "round", r.row.Round, "worker", w,
			"reports", len(credits), "err", err)
		if err := t.reread(r, col, credits); err != nil {
			return err
		}
	}
	return nil
}

// reread reads credited reports again from the stream and adds them to col.
func (t *taskRun) reread(r *roundRun, col aggregator.Collector, credits []shardCredit) error {
	in := t.intake(r)
	for _, c := range credits {
		raw, err := t.readChunk(c.seq)
		if err != nil {
			return fmt.Errorf("reading again the report of %s (stream sequence %d): %w", c.device, c.seq, err)
		}
		t.startReading(c.device)
		got, err := in.fold(c.device, c.seat, r.keys[c.device], rawMsg{raw}, col.Begin)
		t.stopReading(c.device)
		if err != nil {
			return fmt.Errorf("reading again the report of %s (stream sequence %d): %w", c.device, c.seq, err)
		}
		r.noteClipBit(c.device, got.clip)
	}
	return nil
}

// collectShard fetches worker's partial sum for run page by page and adds
// it to col, if it holds exactly the credited reports.
func (t *taskRun) collectShard(ctx context.Context, worker, run string, credits []shardCredit, col aggregator.Collector) error {
	var sum []float64
	var first shardPartialMeta
	for from := 0; ; {
		meta, vals, err := t.collectPage(ctx, worker, run, from)
		if err != nil {
			return err
		}
		if from == 0 {
			first = meta
			if err := matchCredits(meta, credits, t.ulayout.Size()); err != nil {
				return err
			}
			sum = make([]float64, meta.Dim)
		} else if meta.Count != first.Count || meta.Weight != first.Weight {
			return errors.New("the partial sum changed while it was collected")
		}
		from += copy(sum[from:], vals)
		if len(vals) == 0 || from >= len(sum) {
			break
		}
	}
	if err := col.AddSum(sum, first.Weight, first.Count); err != nil {
		return fmt.Errorf("adding the partial sum: %w", err)
	}
	return nil
}

// matchCredits checks a partial sum's first page against what the leader
// credited its worker with.
func matchCredits(meta shardPartialMeta, credits []shardCredit, dim int) error {
	if meta.Broken != "" {
		return fmt.Errorf("the worker's sum is incomplete: %s", meta.Broken)
	}
	if meta.Dim != dim {
		return fmt.Errorf("the partial sum has %d values, want %d", meta.Dim, dim)
	}
	want := make([]uint64, len(credits))
	for i, c := range credits {
		want[i] = c.seq
	}
	slices.Sort(want)
	got := slices.Clone(meta.Seqs)
	slices.Sort(got)
	if meta.Count != len(got) || !slices.Equal(got, want) {
		return fmt.Errorf("the partial sum holds %d reports, not the %d the worker was credited with", meta.Count, len(want))
	}
	return nil
}

// collectPage asks worker for the page of its partial sum from value from.
func (t *taskRun) collectPage(ctx context.Context, worker, run string, from int) (shardPartialMeta, []float64, error) {
	req, _ := json.Marshal(shardCollect{Run: run, From: from})
	actx, cancel := context.WithTimeout(ctx, shardAnswerWait)
	defer cancel()
	msg, err := t.c.d.NC.RequestWithContext(actx, subjectShardCollect+worker, req)
	if err != nil {
		return shardPartialMeta{}, nil, fmt.Errorf("collecting the partial sum: %w", err)
	}
	return decodePartialPage(msg.Data)
}

// decodePartialPage reads a page: a 4-byte length, the JSON head, values.
func decodePartialPage(b []byte) (shardPartialMeta, []float64, error) {
	var meta shardPartialMeta
	if len(b) < 4 {
		return meta, nil, errors.New("partial sum page: too short")
	}
	n := binary.LittleEndian.Uint32(b)
	if uint64(n) > uint64(len(b)-4) {
		return meta, nil, errors.New("partial sum page: head overruns the page")
	}
	if err := json.Unmarshal(b[4:4+n], &meta); err != nil {
		return meta, nil, fmt.Errorf("partial sum page: %w", err)
	}
	body := b[4+n:]
	if len(body)%8 != 0 || len(body)/8 > shardPage {
		return meta, nil, fmt.Errorf("partial sum page: %d bytes of values", len(body))
	}
	vals := make([]float64, len(body)/8)
	for i := range vals {
		vals[i] = math.Float64frombits(binary.LittleEndian.Uint64(body[8*i:]))
	}
	return meta, vals, nil
}

// encodePartialPage writes a page decodePartialPage reads.
func encodePartialPage(meta shardPartialMeta, vals []float64) []byte {
	head, _ := json.Marshal(meta)
	b := make([]byte, 4, 4+len(head)+8*len(vals))
	binary.LittleEndian.PutUint32(b, uint32(len(head)))
	b = append(b, head...)
	for _, v := range vals {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
	}
	return b
}

// dropShards tells the workers a run's partial sums are no longer wanted.
func (t *taskRun) dropShards(run string) {
	if err := t.c.d.NC.Publish(subjectShardDrop, []byte(run)); err != nil {
		t.log().Debug("telling the aggregation workers to drop a round's sums", "err", err)
	}
}
