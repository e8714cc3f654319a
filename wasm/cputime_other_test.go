//go:build !unix

package wasm_test

import (
	"testing"
	"time"
)

// reportCPU reports nothing where the process's CPU time is not at hand.
func reportCPU(*testing.B, time.Duration) {}

func cpuTime() time.Duration { return 0 }
