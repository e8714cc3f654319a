package detect

import (
	"errors"
	"fmt"
	"syscall"
	"unsafe"
)

// affinityCPUs counts the CPUs in this process's scheduler affinity mask,
// now (runtime.NumCPU reads it once, at start-up).
func affinityCPUs() (int, error) {
	for words := 16; words <= 1<<14; words *= 4 {
		mask := make([]uint64, words)
		n, _, errno := syscall.RawSyscall(syscall.SYS_SCHED_GETAFFINITY, 0,
			uintptr(len(mask)*8), uintptr(unsafe.Pointer(&mask[0])))
		if errno == syscall.EINVAL {
			continue // more CPUs than the mask holds
		}
		if errno != 0 {
			return 0, fmt.Errorf("sched_getaffinity: %w", errno)
		}
		count := 0
		for _, w := range mask[:n/8] {
			for ; w != 0; w &= w - 1 {
				count++
			}
		}
		if count == 0 {
			return 0, errors.New("sched_getaffinity: empty mask")
		}
		return count, nil
	}
	return 0, errors.New("sched_getaffinity: mask too large")
}
