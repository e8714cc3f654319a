package coord

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetlearn/fleetlearn/aggregator"
	"github.com/fleetlearn/fleetlearn/internal/lru"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/round"
)

// ShardWorkers are aggregation workers (shard.go): members of the queue
// group that read, check and sum the update reports a leader hands out.
// Every replica may run them, standbys included, so that a standby's cores
// add to the leader's.
type ShardWorkers struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	log     *slog.Logger
	subs    []*nats.Subscription
	workers []*shardWorker

	mu     sync.Mutex
	stream jetstream.Stream // found on the first report: the leader makes it
}

// maxShardRuns bounds the partial sums one worker keeps, each O(model):
// the least recently used is dropped for a new one, and its leader reads
// its reports again.
const maxShardRuns = 4

// maxShardDim bounds the update a dispatch may ask a worker to sum.
const maxShardDim = 1 << 30

// shardWorker is one member of the queue group, with its own partial sums.
type shardWorker struct {
	w    *ShardWorkers
	id   string
	mu   sync.Mutex
	runs map[string]*shardPartial
	tick uint64
	kept []float32
}

type shardPartial struct {
	acc    *aggregator.Accumulator
	seqs   []uint64
	broken string
	used   uint64
}

// StartShardWorkers joins n workers to the queue group on nc. Stop leaves it.
func StartShardWorkers(nc *nats.Conn, n int, log *slog.Logger) (*ShardWorkers, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("aggregation workers: %w", err)
	}
	w := &ShardWorkers{nc: nc, js: js, log: log}
	var id [6]byte
	rand.Read(id[:])
	for i := range n {
		sw := &shardWorker{w: w, id: fmt.Sprintf("%s-%d", hex.EncodeToString(id[:]), i), runs: map[string]*shardPartial{}}
		w.workers = append(w.workers, sw)
		for _, sub := range []func() (*nats.Subscription, error){
			func() (*nats.Subscription, error) { return nc.QueueSubscribe(subjectShardWork, shardQueue, sw.work) },
			func() (*nats.Subscription, error) { return nc.Subscribe(subjectShardCollect+sw.id, sw.collect) },
			func() (*nats.Subscription, error) { return nc.Subscribe(subjectShardDrop, sw.drop) },
		} {
			s, err := sub()
			if err != nil {
				w.Stop()
				return nil, fmt.Errorf("aggregation workers: subscribe: %w", err)
			}
			w.subs = append(w.subs, s)
		}
	}
	if nc.IsConnected() {
		// Subscribed before the first dispatch; a connection still being
		// made subscribes once it is.
		nc.Flush()
	}
	return w, nil
}

// Stop leaves the queue group; the partial sums go with it (their leaders
// read those reports again). Safe to call twice.
func (w *ShardWorkers) Stop() {
	w.mu.Lock()
	subs := w.subs
	w.subs = nil
	w.mu.Unlock()
	for _, s := range subs {
		s.Unsubscribe()
	}
}

// reports is the reports stream, looked up once.
func (w *ShardWorkers) reports() (jetstream.Stream, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stream != nil {
		return w.stream, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), chunkRead)
	defer cancel()
	s, err := w.js.Stream(ctx, wire.StreamReports)
	if err != nil {
		return nil, err
	}
	w.stream = s
	return s, nil
}

func (w *ShardWorkers) read(seq uint64) (*jetstream.RawStreamMsg, error) {
	s, err := w.reports()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), chunkRead)
	defer cancel()
	return s.GetMsg(ctx, seq)
}

// work checks one report and adds it to the run's partial sum.
func (sw *shardWorker) work(m *nats.Msg) {
	a := sw.handle(m.Data)
	a.Worker = sw.id
	b, _ := json.Marshal(a)
	if err := m.Respond(b); err != nil {
		sw.w.log.Debug("answering a leader's dispatch", "err", err)
	}
}

func (sw *shardWorker) handle(data []byte) shardAnswer {
	var job shardWork
	if err := json.Unmarshal(data, &job); err != nil {
		return shardAnswer{Failed: fmt.Sprintf("decode dispatch: %v", err)}
	}
	layout, err := shardLayout(job.Terms.Trained)
	if err != nil {
		return shardAnswer{Failed: err.Error()}
	}
	raw, err := sw.w.read(job.Seq)
	if err != nil {
		return shardAnswer{Failed: fmt.Sprintf("read stream sequence %d: %v", job.Seq, err)}
	}
	task, rnd, device, err := wire.ParseReportSubject(raw.Subject)
	if err != nil || task != job.Terms.Spec.Task || rnd != job.Terms.Spec.Round || device != job.Device ||
		wire.IsEvalSubject(raw.Subject) {
		return shardAnswer{Failed: fmt.Sprintf("stream sequence %d holds %q, not an update of %s", job.Seq, raw.Subject, job.Device)}
	}
	var key ed25519.PublicKey
	if len(job.Key) > 0 {
		if len(job.Key) != ed25519.PublicKeySize {
			return shardAnswer{Failed: "bad device key"}
		}
		key = job.Key
	}
	sw.mu.Lock()
	defer sw.mu.Unlock()
	p, err := sw.partial(job.Run, layout.Size())
	if err != nil {
		return shardAnswer{Failed: err.Error()}
	}
	if p.broken != "" {
		return shardAnswer{Failed: "this worker's sum for the round is incomplete"}
	}
	in := &updateIntake{spec: job.Terms.Spec, encoding: job.Terms.Encoding, layout: layout, trained: job.Terms.Trained,
		influence: job.Terms.Influence, maxReport: job.Terms.MaxReport, enrollment: job.Terms.Enrollment,
		adaptive: job.Terms.Adaptive, read: func(seq uint64) (string, []byte, error) {
			raw, err := sw.w.read(seq)
			if err != nil {
				return "", nil, err
			}
			return raw.Subject, raw.Data, nil
		}, kept: &sw.kept}
	got, err := in.fold(device, round.Seat{Examples: job.Examples}, key, rawMsg{raw}, p.acc.Begin)
	switch {
	case errors.Is(err, errPartlyAdded):
		p.broken = err.Error()
		return shardAnswer{Failed: err.Error(), Chunked: got.chunked}
	case errors.Is(err, ErrReport):
		// The leader words the refusal again (refuseAs).
		why := strings.TrimPrefix(err.Error(), ErrReport.Error()+": ")
		return shardAnswer{Refused: why, Class: refusalReason(err), Chunked: got.chunked}
	case err != nil:
		// Not the report's fault (the stream, say): the leader reads it.
		return shardAnswer{Failed: err.Error(), Chunked: got.chunked}
	}
	p.seqs = append(p.seqs, job.Seq)
	return shardAnswer{Metrics: got.metrics, Weight: got.weight, Chunked: got.chunked, Clip: got.clip}
}

// partial is run's partial sum, made (and the least recently used one
// dropped) on its first report; sw.mu is held.
func (sw *shardWorker) partial(run string, dim int) (*shardPartial, error) {
	sw.tick++
	if p := sw.runs[run]; p != nil {
		if p.acc.Dim() != dim {
			return nil, fmt.Errorf("round run %s sums %d values, not %d", run, p.acc.Dim(), dim)
		}
		p.used = sw.tick
		return p, nil
	}
	if dim <= 0 || dim > maxShardDim {
		return nil, fmt.Errorf("an update of %d values is outside (0, %d]", dim, maxShardDim)
	}
	if len(sw.runs) >= maxShardRuns {
		lru.DropOldest(sw.runs, func(p *shardPartial) uint64 { return p.used })
	}
	acc, err := aggregator.NewAccumulator(dim, 0)
	if err != nil {
		return nil, err
	}
	p := &shardPartial{acc: acc, used: sw.tick}
	sw.runs[run] = p
	return p, nil
}

// collect answers a page of a partial sum.
func (sw *shardWorker) collect(m *nats.Msg) {
	var req shardCollect
	if err := json.Unmarshal(m.Data, &req); err != nil {
		m.Respond(encodePartialPage(shardPartialMeta{Broken: fmt.Sprintf("decode request: %v", err)}, nil))
		return
	}
	sw.mu.Lock()
	p := sw.runs[req.Run]
	var meta shardPartialMeta
	var vals []float64
	switch {
	case p == nil:
		meta.Broken = "no partial sum for this round run (dropped, or the worker restarted)"
	case p.broken != "":
		meta.Broken = p.broken
	default:
		meta = shardPartialMeta{Count: p.acc.Count(), Weight: p.acc.TotalWeight(), Dim: p.acc.Dim()}
		if req.From == 0 {
			meta.Seqs = p.seqs
		}
		if req.From >= 0 && req.From < p.acc.Dim() {
			vals = make([]float64, min(shardPage, p.acc.Dim()-req.From))
			vals = vals[:p.acc.WeightedSum(vals, req.From)]
		}
	}
	b := encodePartialPage(meta, vals)
	sw.mu.Unlock()
	if err := m.Respond(b); err != nil {
		sw.w.log.Debug("answering a partial sum's collection", "err", err)
	}
}

// drop forgets a run's partial sum.
func (sw *shardWorker) drop(m *nats.Msg) {
	sw.mu.Lock()
	delete(sw.runs, string(m.Data))
	sw.mu.Unlock()
}

// shardLayout is the update layout of the trained tensors, in order.
func shardLayout(trained []round.Tensor) (model.Layout, error) {
	var l model.Layout
	off := 0
	for _, t := range trained {
		size := 1
		shape := make([]int, len(t.Shape))
		for i, d := range t.Shape {
			if d == 0 || d > maxShardDim || size > maxShardDim/int(d) {
				return l, fmt.Errorf("tensor %q: shape %v is outside what a worker sums", t.Name, t.Shape)
			}
			shape[i] = int(d)
			size *= int(d)
		}
		if off > maxShardDim-size {
			return l, errors.New("the update is larger than a worker sums")
		}
		l.Entries = append(l.Entries, model.LayoutEntry{Name: t.Name, Shape: shape, Offset: off, Size: size})
		off += size
	}
	return l, nil
}
