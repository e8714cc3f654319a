package wasm_test

import (
	"testing"

	"github.com/fleetlearn/fleetlearn/wasm"
)

func TestNewRefusesLimits(t *testing.T) {
	s, err := wasm.New(wasm.WithLimits(wasm.Limits{MemoryPages: wasm.MaxMemoryPages + 1}))
	if err == nil {
		s.Close(t.Context())
		t.Fatal("New accepted a memory cap past wasm32")
	}
	wantSentinel(t, err, wasm.ErrLimits, "65537", "65536")
}
