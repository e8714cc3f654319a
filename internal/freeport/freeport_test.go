package freeport

import (
	"net"
	"strconv"
	"testing"
)

func TestGetBelowEphemeralRange(t *testing.T) {
	hi := ephemeralLow()
	seen := map[int]bool{}
	for range 50 {
		p := Must(t)
		if hi > low && (p < low || p >= hi) {
			t.Fatalf("port %d outside [%d, %d)", p, low, hi)
		}
		seen[p] = true
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Fatalf("port %d was handed out but cannot be bound: %v", p, err)
		}
		l.Close()
	}
	// Random picks: fifty draws from thousands of ports repeat rarely.
	if len(seen) < 40 {
		t.Fatalf("%d distinct ports in 50 picks", len(seen))
	}
}

func TestGetSkipsHeldPorts(t *testing.T) {
	// Hold many ports of the range; every port handed out must be another.
	held := map[int]bool{}
	for range 200 {
		p := Must(t)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		t.Cleanup(func() { l.Close() })
		held[p] = true
	}
	for range 200 {
		if p := Must(t); held[p] {
			t.Fatalf("port %d is held but was handed out", p)
		}
	}
}
