package clock

import (
	"sort"
	"sync"
	"time"
)

// Fake is a Clock that moves only when told to. Timers fire, in deadline
// order, as Advance or Set passes their deadlines; channel timers deliver
// without blocking (the channel has room for one tick, as time.Timer's
// does) and AfterFunc timers run their function in a new goroutine.
type Fake struct {
	mu      sync.Mutex
	now     time.Time
	waiters []*fakeTimer
	changed chan struct{} // closed and replaced whenever waiters change
	seq     uint64
}

// NewFake returns a fake clock reading start.
func NewFake(start time.Time) *Fake {
	return &Fake{now: start, changed: make(chan struct{})}
}

// Now is the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// Advance moves the clock forward by d, firing what falls due.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	to := f.now.Add(d)
	f.mu.Unlock()
	f.Set(to)
}

// Set moves the clock to t (never backwards), firing what falls due, each
// timer at its own deadline.
func (f *Fake) Set(t time.Time) {
	for {
		f.mu.Lock()
		if t.Before(f.now) {
			f.mu.Unlock()
			return
		}
		var next *fakeTimer
		for _, w := range f.waiters {
			if !w.when.After(t) && (next == nil || w.when.Before(next.when) || (w.when.Equal(next.when) && w.seq < next.seq)) {
				next = w
			}
		}
		if next == nil {
			f.now = t
			f.mu.Unlock()
			return
		}
		if next.when.After(f.now) {
			f.now = next.when
		}
		f.fireLocked(next)
		f.mu.Unlock()
	}
}

// AdvanceToNext moves the clock to the earliest pending deadline and fires
// what falls due there; it reports false (and does nothing) when no timer
// is pending.
func (f *Fake) AdvanceToNext() bool {
	f.mu.Lock()
	if len(f.waiters) == 0 {
		f.mu.Unlock()
		return false
	}
	next := f.waiters[0].when
	for _, w := range f.waiters[1:] {
		if w.when.Before(next) {
			next = w.when
		}
	}
	f.mu.Unlock()
	f.Set(next)
	return true
}

// Pending is the number of timers and tickers waiting to fire.
func (f *Fake) Pending() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.waiters)
}

// Deadlines are the pending timers' fire times, earliest first.
func (f *Fake) Deadlines() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]time.Time, len(f.waiters))
	for i, w := range f.waiters {
		out[i] = w.when
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Before(out[j]) })
	return out
}

// Changed returns a channel closed the next time a timer is created,
// stopped, reset or fired: a test waits on it (with its own bound) for the
// code under test to arm the timer it expects, instead of sleeping.
func (f *Fake) Changed() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.changed
}

func (f *Fake) notifyLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

// NewTimer implements Clock.
func (f *Fake) NewTimer(d time.Duration) Timer {
	t := &fakeTimer{f: f, c: make(chan time.Time, 1)}
	t.ch = t.c
	t.Reset(d)
	return t
}

// AfterFunc implements Clock.
func (f *Fake) AfterFunc(d time.Duration, fn func()) Timer {
	t := &fakeTimer{f: f, fn: fn}
	t.Reset(d)
	return t
}

// NewTicker implements Clock.
func (f *Fake) NewTicker(d time.Duration) Ticker {
	if d <= 0 {
		panic("clock: non-positive interval for NewTicker")
	}
	t := &fakeTimer{f: f, c: make(chan time.Time, 1), period: d}
	t.ch = t.c
	t.Reset(d)
	return fakeTicker{t}
}

type fakeTimer struct {
	f      *Fake
	c      chan time.Time
	ch     <-chan time.Time
	fn     func()
	period time.Duration // tickers
	when   time.Time
	seq    uint64
	active bool
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	was := t.active
	t.f.removeLocked(t)
	return was
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	was := t.active
	t.f.removeLocked(t)
	t.when = t.f.now.Add(max(d, 0))
	t.f.seq++
	t.seq = t.f.seq
	t.active = true
	t.f.waiters = append(t.f.waiters, t)
	t.f.notifyLocked()
	if d <= 0 {
		t.f.fireLocked(t)
	}
	return was
}

func (f *Fake) removeLocked(t *fakeTimer) {
	if !t.active {
		return
	}
	t.active = false
	for i, w := range f.waiters {
		if w == t {
			f.waiters = append(f.waiters[:i], f.waiters[i+1:]...)
			break
		}
	}
	f.notifyLocked()
}

// fireLocked delivers t's tick and either re-arms it (tickers) or retires it.
func (f *Fake) fireLocked(t *fakeTimer) {
	at := t.when
	f.removeLocked(t)
	if t.period > 0 {
		t.when = at.Add(t.period)
		f.seq++
		t.seq = f.seq
		t.active = true
		f.waiters = append(f.waiters, t)
	}
	if t.fn != nil {
		go t.fn()
		return
	}
	select {
	case t.c <- at:
	default: // a tick nobody took: dropped, as time.Ticker drops it
	}
}

type fakeTicker struct{ t *fakeTimer }

func (k fakeTicker) C() <-chan time.Time { return k.t.ch }
func (k fakeTicker) Stop()               { k.t.Stop() }
func (k fakeTicker) Reset(d time.Duration) {
	if d <= 0 {
		panic("clock: non-positive interval for Ticker.Reset")
	}
	k.t.f.mu.Lock()
	k.t.period = d
	k.t.f.mu.Unlock()
	k.t.Reset(d)
}
