package backoff

import (
	"math/rand/v2"
	"testing"
	"time"
)

func TestDoublesToMax(t *testing.T) {
	b := New(100*time.Millisecond, time.Second, nil)
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, w := range want {
		if got := b.Next(); got != w*time.Millisecond {
			t.Fatalf("wait %d = %v, want %v", i, got, w*time.Millisecond)
		}
	}
	if b.Attempts() != len(want) {
		t.Fatalf("attempts = %d", b.Attempts())
	}
	b.Reset()
	if got := b.Next(); got != 100*time.Millisecond {
		t.Fatalf("after reset: %v", got)
	}
}

func TestJitterWithinStep(t *testing.T) {
	b := New(time.Second, 4*time.Second, func(d time.Duration) time.Duration { return d - 1 })
	if got := b.Next(); got != 2*time.Second-1 {
		t.Fatalf("jittered wait = %v", got)
	}
}

func TestJitterRange(t *testing.T) {
	j := Jitter(rand.New(rand.NewPCG(1, 2)))
	if j(0) != 0 || j(-time.Second) != 0 {
		t.Fatal("jitter of a non-positive duration")
	}
	for range 1000 {
		if d := j(time.Millisecond); d < 0 || d >= time.Millisecond {
			t.Fatalf("jitter %v out of [0, 1ms)", d)
		}
	}
}
