//go:build !unix

package edge_test

import "time"

// cpuTime is not at hand here: the benchmarks report zero CPU.
func cpuTime() time.Duration { return 0 }
