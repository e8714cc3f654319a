//go:build unix

package edge_test

import (
	"syscall"
	"time"
)

// cpuTime is the process's CPU time, user and system, every thread: the
// server's and the agent's together in the benchmarks.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
