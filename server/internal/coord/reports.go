package coord

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetlearn/fleetlearn/internal/backoff"
	"github.com/fleetlearn/fleetlearn/internal/clock"
	"github.com/fleetlearn/fleetlearn/proto/wire"
)

// Report consumers. A round reads its reports through a consumer of its
// own with as many replicas as the stream: when the NATS node holding it
// dies, another replica leads it and the pull resumes where it was. An
// ordered consumer (one replica, recreated by the client after a failure)
// could stay stuck recreating itself after a node was killed, and a round
// then missed reports the cluster had stored.
const (
	// consumerAttempt bounds one attempt to create the consumer: during a
	// leader election the JetStream API does not answer, and the 30 s
	// default would spend the round's selection time on one try.
	consumerAttempt = 5 * time.Second
	// consumerInactive deletes a consumer a crashed server left behind.
	consumerInactive = 10 * time.Minute
)

// reportConsumer creates the consumer of round's reports, replaying them
// from the start of the stream, so a restart sees every report it had
// before plus the new ones (reports are de-duplicated per device). It
// retries until ctx ends.
//
// headersOnly delivers each report's headers without its bytes (a sharded
// round's: its workers read the bytes, and the leader only when it must,
// by sequence: fullMsg).
func (t *taskRun) reportConsumer(ctx context.Context, round uint64, headersOnly bool) (jetstream.Consumer, func(), error) {
	return t.consumeReports(ctx, round, wire.RoundFilters(t.id, round), 0, headersOnly)
}

// pull starts delivering cons's reports of round to msgs until ctx ends or
// the returned stop is called. What is in flight is bounded: reports are
// ~400 KB each, and the default (500 messages) overruns the connection's
// pending limit at large cohorts. Missed heartbeats (a NATS node lost)
// are the client's to recover from by pulling again, from the consumer's
// new leader.
func (t *taskRun) pull(ctx context.Context, cons jetstream.Consumer, round uint64, msgs chan<- jetstream.Msg) (stop func(), err error) {
	cc, err := cons.Consume(func(m jetstream.Msg) {
		select {
		case msgs <- m:
		case <-ctx.Done():
		}
	}, jetstream.PullMaxBytes(8<<20), jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		t.log().Debug("report consumer", "round", round, "err", err)
	}))
	if err != nil {
		return nil, fmt.Errorf("round %d: consume: %w", round, err)
	}
	return cc.Stop, nil
}

// consumeReports creates a consumer of round's reports on filters, from
// stream sequence from (0: the start of the stream), as reportConsumer.
func (t *taskRun) consumeReports(ctx context.Context, round uint64, filters []string, from uint64, headersOnly bool) (jetstream.Consumer, func(), error) {
	var id [6]byte
	rand.Read(id[:])
	name := fmt.Sprintf("fl-%s-r%d-%s", t.id, round, hex.EncodeToString(id[:]))
	cfg := jetstream.ConsumerConfig{
		Durable:           name,
		Description:       fmt.Sprintf("reports of task %s round %d", t.id, round),
		FilterSubjects:    filters,
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		AckPolicy:         jetstream.AckNonePolicy,
		InactiveThreshold: consumerInactive,
		Replicas:          t.c.d.Stream.CachedInfo().Config.Replicas,
		HeadersOnly:       headersOnly,
	}
	if from > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from
	}
	b := backoff.New(250*time.Millisecond, 5*time.Second, t.c.jitter)
	for {
		actx, cancel := context.WithTimeout(ctx, consumerAttempt)
		cons, err := t.c.d.JS.CreateOrUpdateConsumer(actx, wire.StreamReports, cfg)
		cancel()
		if err == nil {
			return cons, func() {
				dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), consumerAttempt)
				defer cancel()
				if err := t.c.d.JS.DeleteConsumer(dctx, wire.StreamReports, name); err != nil {
					t.c.d.Log.Debug("report consumer left to expire", "consumer", name, "err", err)
				}
			}, nil
		}
		if ctx.Err() != nil {
			return nil, nil, fmt.Errorf("round %d: consumer: %w", round, err)
		}
		wait := b.Next()
		t.c.d.Log.Warn("creating the round's report consumer", "task", t.id, "round", round, "err", err,
			"attempt", b.Attempts(), "retry_in", wait)
		if !clock.Sleep(t.clock(), wait, ctx.Done()) {
			return nil, nil, fmt.Errorf("round %d: consumer: %w (last error: %v)", round, ctx.Err(), err)
		}
	}
}
