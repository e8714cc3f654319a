package demo

import (
	"strings"
	"testing"
)

// TestLMCorpusBuiltIn: without a Go installation the language-model demo
// reads the copy of the standard library's source built into the data
// package, and it holds enough private packages for a fleet of devices.
func TestLMCorpusBuiltIn(t *testing.T) {
	public, devices, heldOut, err := lmCorpus("", 16)
	if err != nil {
		t.Fatal(err)
	}
	if len(devices) != 16 || public.Len() == 0 || heldOut.Len() == 0 {
		t.Fatalf("%d devices, %d public and %d held-out windows", len(devices), public.Len(), heldOut.Len())
	}
	for i, d := range devices {
		if d.Len() < lmPerDevice/2 || d.Len() > lmPerDevice {
			t.Errorf("device %d: %d windows, want %d to %d", i, d.Len(), lmPerDevice/2, lmPerDevice)
		}
	}
	if _, _, _, err := lmCorpus("", 1000); err == nil || !strings.Contains(err.Error(), "built-in copy") ||
		!strings.Contains(err.Error(), "--edges") {
		t.Errorf("too many edges for the built-in copy: %v", err)
	}
}
