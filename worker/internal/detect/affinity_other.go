//go:build !linux

package detect

import "errors"

// affinityCPUs has no portable reading outside Linux: Detect falls back to
// runtime.NumCPU.
func affinityCPUs() (int, error) { return 0, errors.New("sched_getaffinity: not on Linux") }
