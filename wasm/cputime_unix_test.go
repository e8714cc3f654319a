//go:build unix

package wasm_test

import (
	"syscall"
	"testing"
	"time"
)

// reportCPU adds the process's CPU time (user and system, every thread)
// per operation to a benchmark's figures: a device pays in CPU, and a load
// that compiles on several threads looks cheaper by the wall clock alone.
// Call it after the loop.
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric((cpuTime()-start).Seconds()/float64(b.N), "cpu-s/op")
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
