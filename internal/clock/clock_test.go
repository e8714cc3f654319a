package clock_test

import (
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/internal/clock"
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestFakeTimersFireInOrder(t *testing.T) {
	f := clock.NewFake(epoch)
	a := f.NewTimer(2 * time.Second)
	b := f.NewTimer(time.Second)
	if f.Pending() != 2 {
		t.Fatalf("pending = %d", f.Pending())
	}
	f.Advance(1500 * time.Millisecond)
	select {
	case at := <-b.C():
		if !at.Equal(epoch.Add(time.Second)) {
			t.Fatalf("fired at %v", at)
		}
	default:
		t.Fatal("1 s timer did not fire")
	}
	select {
	case <-a.C():
		t.Fatal("2 s timer fired early")
	default:
	}
	if !f.AdvanceToNext() {
		t.Fatal("no pending timer")
	}
	<-a.C()
	if !f.Now().Equal(epoch.Add(2 * time.Second)) {
		t.Fatalf("now = %v", f.Now())
	}
	if f.AdvanceToNext() {
		t.Fatal("timers left")
	}
}

func TestFakeStopReset(t *testing.T) {
	f := clock.NewFake(epoch)
	tm := f.NewTimer(time.Second)
	if !tm.Stop() || tm.Stop() {
		t.Fatal("Stop should report the timer active once")
	}
	f.Advance(time.Hour)
	select {
	case <-tm.C():
		t.Fatal("stopped timer fired")
	default:
	}
	tm.Reset(time.Minute)
	f.Advance(time.Minute)
	<-tm.C()
	tm.Reset(0) // fires at once, like time.Timer
	<-tm.C()
}

func TestFakeTickerAndAfterFunc(t *testing.T) {
	f := clock.NewFake(epoch)
	k := f.NewTicker(time.Second)
	defer k.Stop()
	done := make(chan struct{})
	f.AfterFunc(3*time.Second, func() { close(done) })
	for i := 1; i <= 3; i++ {
		f.Advance(time.Second)
		if at := <-k.C(); !at.Equal(epoch.Add(time.Duration(i) * time.Second)) {
			t.Fatalf("tick %d at %v", i, at)
		}
	}
	<-done
}

func TestChangedSignalsNewTimer(t *testing.T) {
	f := clock.NewFake(epoch)
	ch := f.Changed()
	go f.NewTimer(time.Second)
	<-ch
	if d := f.Deadlines(); len(d) != 1 || !d[0].Equal(epoch.Add(time.Second)) {
		t.Fatalf("deadlines = %v", d)
	}
}

func TestSleep(t *testing.T) {
	done := make(chan struct{})
	close(done)
	if clock.Sleep(clock.Real(), time.Hour, done) {
		t.Fatal("Sleep should end when done closes")
	}
	if !clock.Sleep(clock.Real(), 0, nil) {
		t.Fatal("zero sleep")
	}
}
