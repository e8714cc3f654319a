package coord

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/round"
	"github.com/fleetlearn/fleetlearn/server/internal/metrics"
)

// Report storage quotas: the accounting is the round engine's
// (round.Storage); here the server reads the headers-only notices of stored
// messages and does the purges the accounting asks for.

const (
	// purgeTimeout bounds one purge or delete request.
	purgeTimeout = 5 * time.Second
	// msgSizeHeader is nats-server's header with a headers-only notice's
	// payload size.
	msgSizeHeader = "Nats-Msg-Size"
)

// notice is what the server learns of one stored message from its
// headers-only notice.
type notice struct {
	round.Stored        // Set from the chunk's message id
	seq          uint64 // stream sequence
}

// storeQuota is the task's accounting of the open round's stored messages.
type storeQuota struct {
	round   uint64
	devices map[string]*round.Storage
}

// over reports whether device went over its quota in round.
func (q *storeQuota) over(round uint64, device string) bool {
	if q == nil || q.round != round {
		return false
	}
	return q.devices[device].Over()
}

// storeQuotaBytes is the most one device may keep in the stream for the
// open round: its largest report and a chunked report's framing. While the
// round is still being loaded its kind is not known, and the larger
// training quota holds.
func (t *taskRun) storeQuotaBytes(r *roundRun) uint64 {
	kind := pb.RoundKind_ROUND_KIND_TRAIN
	if r != nil {
		kind = r.row.Kind
	}
	return t.maxReportBytesFor(kind) + round.StorageFraming
}

// chargeStored charges a stored message of round to device and applies the
// quota. It is called for rounds that are open (or being loaded).
func (t *taskRun) chargeStored(subj string, rnd uint64, device string, n notice) {
	t.mu.Lock()
	r := t.round
	if r != nil && r.row.Round != rnd {
		r = nil
	}
	q := t.quotaFor(rnd)
	quota := t.storeQuotaBytes(r)
	d := q.devices[device]
	if d == nil {
		d = &round.Storage{}
		q.devices[device] = d
	}
	seated := r == nil || r.seated(device)
	if t.async != nil {
		// A device trains on its seat's plan, or sends its masked input as
		// a member of a secure buffer's group.
		p, ok := t.async.plans[device]
		seated = ok && p.round == rnd || r != nil && r.seated(device)
	}
	act := d.Charge(n.Stored, quota, seated)
	t.mu.Unlock()
	later := func(f func()) { t.afterRead(device, f) }

	c := t.c
	switch act {
	case round.Keep:
	case round.DeleteMsg:
		later(func() { c.deleteStored(n.seq) })
	case round.PurgeEarlier:
		later(func() { c.purgeStored(subj, n.seq) })
	case round.PurgeUnseated:
		c.d.Log.Info("chunk of a device not in the round purged", "task", t.id, "round", rnd, "device", device)
		c.d.Metrics.Refused(metrics.RefusedCohort)
		c.purgeStored(subj, 0)
	case round.OverQuota:
		why := fmt.Sprintf("device %q stored more than the %d bytes round %d admits per device; what it stored for the round was purged and its reports are refused", device, quota, rnd)
		c.d.Log.Warn("report storage quota exceeded", "task", t.id, "round", rnd, "device", device, "quota", quota)
		c.d.Metrics.Refused(metrics.RefusedQuota)
		c.d.Metrics.QuotaPurges.Inc()
		c.receipt(t.id, rnd, device, refuse("%s", why).Error())
		if r != nil {
			t.noteFailure(r, device, why)
		}
		later(func() { c.purgeDevice(t.id, rnd, device) })
	case round.Repurge:
		c.d.Metrics.QuotaPurges.Inc()
		later(func() { c.purgeStored(subj, 0) })
	}
}

// quotaFor is the storage accounting of round rnd: the one round's a
// synchronous task keeps, or the async round's. t.mu is held.
func (t *taskRun) quotaFor(rnd uint64) *storeQuota {
	if t.async != nil {
		return t.async.quota(rnd)
	}
	if t.quota == nil || t.quota.round != rnd {
		t.quota = &storeQuota{round: rnd, devices: map[string]*round.Storage{}}
	}
	return t.quota
}

// startReading marks device's report as being read: purges of its messages
// wait (chargeStored) until stopReading runs them.
func (t *taskRun) startReading(device string) {
	t.mu.Lock()
	if t.reading == nil {
		t.reading = map[string]int{}
	}
	t.reading[device]++
	t.mu.Unlock()
}

// stopReading ends the read and runs the purges it held off.
func (t *taskRun) stopReading(device string) {
	t.mu.Lock()
	var fs []func()
	if t.reading[device]--; t.reading[device] <= 0 {
		delete(t.reading, device)
		fs = t.deferred[device]
		delete(t.deferred, device)
	}
	t.mu.Unlock()
	for _, f := range fs {
		f()
	}
}

// afterRead runs purge, of device's messages, now, or once the report of
// device being read is read: its second pass must find the chunks the
// first checked (intake.go).
func (t *taskRun) afterRead(device string, purge func()) {
	t.mu.Lock()
	if t.reading[device] > 0 {
		if t.deferred == nil {
			t.deferred = map[string][]func(){}
		}
		t.deferred[device] = append(t.deferred[device], purge)
		t.mu.Unlock()
		return
	}
	t.mu.Unlock()
	purge()
}

// seated reports whether device holds a seat in the round.
func (r *roundRun) seated(device string) bool {
	_, ok := r.cohort.SeatOf(device)
	return ok
}

// parseNotice reads a headers-only notice of a message stored on subj.
// nats-server appends its own headers after the publisher's, so a device
// that sets Nats-Sequence or Nats-Msg-Size itself is read past: the last
// value is the server's.
func parseNotice(subj string, h nats.Header) (notice, error) {
	last := func(k string) string {
		v := h.Values(k)
		if len(v) == 0 {
			return ""
		}
		return v[len(v)-1]
	}
	seq, err := strconv.ParseUint(last(jetstream.SequenceHeader), 10, 64)
	if err != nil || seq == 0 {
		return notice{}, fmt.Errorf("notice of %s: bad %s %q", subj, jetstream.SequenceHeader, last(jetstream.SequenceHeader))
	}
	size, err := strconv.ParseUint(last(msgSizeHeader), 10, 64)
	if err != nil {
		return notice{}, fmt.Errorf("notice of %s: bad %s %q", subj, msgSizeHeader, last(msgSizeHeader))
	}
	for k, vs := range h {
		for _, v := range vs {
			size += uint64(len(k) + len(v) + 4)
		}
	}
	n := notice{Stored: round.Stored{Chunk: wire.IsChunkSubject(subj), Size: size}, seq: seq}
	if n.Chunk {
		// wire.ChunkMsgID: "<report id>/<payload sha256>/<index>".
		if parts := strings.Split(h.Get(jetstream.MsgIDHeader), "/"); len(parts) == 3 {
			n.Set = parts[1]
		}
	}
	return n, nil
}

// charge reads a notice of a message stored for tr's open round and
// charges it to device.
func (c *Coordinator) charge(tr *taskRun, subj string, round uint64, device string, h nats.Header) {
	n, err := parseNotice(subj, h)
	if err != nil {
		// Only nats-server publishes notices; one it did not write is a
		// misconfiguration, not a device's doing.
		c.d.Log.Warn("stored-message notice unreadable", "err", err)
		return
	}
	tr.chargeStored(subj, round, device, n)
}

// purgeStored purges subj's messages below sequence before (all of them
// when before is 0): what nothing will consume, or what is over a quota.
// The notice follows the store, so one purge covers what it announced.
func (c *Coordinator) purgeStored(subj string, before uint64) {
	ctx, cancel := context.WithTimeout(c.ctx, purgeTimeout)
	defer cancel()
	opts := []jetstream.StreamPurgeOpt{jetstream.WithPurgeSubject(subj)}
	if before > 0 {
		opts = append(opts, jetstream.WithPurgeSequence(before))
	}
	if err := c.d.Stream.Purge(ctx, opts...); err != nil {
		c.d.Log.Warn("purging stored messages", "subject", subj, "err", err)
	}
}

// deleteStored deletes one stored message.
func (c *Coordinator) deleteStored(seq uint64) {
	ctx, cancel := context.WithTimeout(c.ctx, purgeTimeout)
	defer cancel()
	if err := c.d.Stream.DeleteMsg(ctx, seq); err != nil {
		c.d.Log.Debug("deleting an orphan chunk", "seq", seq, "err", err)
	}
}

// purgeDevice purges everything device stored for task's round.
func (c *Coordinator) purgeDevice(task string, round uint64, device string) {
	for _, s := range []string{wire.ChunkSubject(task, round, device), wire.ReportSubject(task, round, device), wire.EvalSubject(task, round, device)} {
		c.purgeStored(s, 0)
	}
}
