// Package memlimit keeps the Go runtime's soft memory limit at what a
// process's large, long-lived buffers need plus a fixed headroom.
//
// Go collects garbage when the heap has grown by GOGC percent (100) over
// what the last collection found live. A server whose live heap is mostly a
// few model-sized buffers (a global model, a running sum) therefore lets
// garbage grow to the size of those buffers before it collects: a 400 MB
// model with its float64 sum is 1.2 GB live and may reach 2.4 GB before a
// collection. Holding the buffers here sets the soft memory limit
// (runtime/debug.SetMemoryLimit) to their total, plus what else the last
// collection found live, plus the headroom, so that garbage is collected at
// the headroom instead, whatever the model size. Without holds the
// runtime's limit is left as it was.
//
// The runtime has one heap, so a process has one Limit (Process): servers
// that share a process (tests) add their holds up.
package memlimit

import (
	"math"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

var (
	processOnce sync.Once
	process     *Limit
)

// Process returns the process's Limit, made with the first headroom above
// 0 that it is asked for; nil for a headroom of 0 or less.
func Process(headroom int64) *Limit {
	if headroom <= 0 {
		return nil
	}
	processOnce.Do(func() { process = New(headroom) })
	return process
}

// liveHeap is what the last garbage collection found live.
func liveHeap() int64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return int64(s[0].Value.Uint64())
}

// Limit tracks the bytes held and sets the runtime's limit. A nil *Limit
// holds nothing and sets nothing. Safe for concurrent use.
type Limit struct {
	mu       sync.Mutex
	headroom int64
	held     int64
	set      func(int64) int64
	live     func() int64
	prev     int64 // the runtime's limit before the first hold
	last     int64 // the limit last set, so that an unchanged one is not set again
}

// Option configures a Limit.
type Option func(*Limit)

// WithSetter replaces debug.SetMemoryLimit (for tests).
func WithSetter(set func(int64) int64) Option { return func(l *Limit) { l.set = set } }

// WithLive replaces the live heap the last collection found (for tests).
func WithLive(live func() int64) Option { return func(l *Limit) { l.live = live } }

// New returns a Limit that, while anything is held, keeps the runtime's
// soft limit at the bytes held, plus the rest of the live heap, plus
// headroom. A headroom of 0 or less returns nil: the runtime's limit stays
// as it is. Servers use Process; New is for tests.
func New(headroom int64, opts ...Option) *Limit {
	if headroom <= 0 {
		return nil
	}
	l := &Limit{headroom: headroom, set: debug.SetMemoryLimit, live: liveHeap}
	for _, o := range opts {
		o(l)
	}
	l.prev = l.set(-1) // a negative limit reads the current one
	l.last = l.prev
	return l
}

// Hold counts n more bytes held until release is called (once; later calls
// do nothing).
func (l *Limit) Hold(n int64) (release func()) {
	if l == nil || n <= 0 {
		return func() {}
	}
	l.mu.Lock()
	l.held += n
	l.apply()
	l.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			l.held -= n
			l.apply()
			l.mu.Unlock()
		})
	}
}

// apply sets the runtime's limit for what is held; mu is held. Holds
// smaller than the headroom leave the runtime's limit alone: garbage as
// large as the live heap is then no more than the headroom would allow
// anyway, and a tighter limit would only collect more often.
func (l *Limit) apply() {
	if l.held < l.headroom {
		l.setLimit(l.prev)
		return
	}
	// What is live besides the holds (connections, caches, other tasks'
	// small state) is not garbage: a limit below it would only make the
	// collector run without end. Holds just taken may not be live yet.
	other := max(0, l.live()-l.held)
	want := l.held + other + l.headroom
	if want < 0 || want > l.prev && l.prev != math.MaxInt64 {
		// A limit set from outside (GOMEMLIMIT) is never raised.
		want = l.prev
	}
	l.setLimit(want)
}

// setLimit sets the runtime's limit unless it is already n: setting it
// takes the heap's lock and may start returning memory to the system, too
// much to do after every report for nothing.
func (l *Limit) setLimit(n int64) {
	if n == l.last {
		return
	}
	l.last = n
	l.set(n)
}

// Refresh sets the limit again for what the last collection found live.
// What else is live changes as the process works (connections, caches a
// library keeps): a limit left below it would have the collector run
// without end, so a caller refreshes as it goes (the server does after
// each report).
func (l *Limit) Refresh() {
	if l == nil {
		return
	}
	l.mu.Lock()
	if l.held >= l.headroom {
		l.apply()
	}
	l.mu.Unlock()
}

// Held returns the bytes held.
func (l *Limit) Held() int64 {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.held
}
