package runner

import (
	"syscall"
	"unsafe"
)

const (
	pPID    = 1          // P_PID
	wNoWait = 0x01000000 // WNOWAIT: leave the child waitable
)

// waitExited blocks until pid has exited without reaping it, so its process
// group id stays reserved until the group has been killed.
func waitExited(pid int) error {
	var info [128]byte // siginfo_t
	for {
		_, _, e := syscall.Syscall6(syscall.SYS_WAITID, pPID, uintptr(pid),
			uintptr(unsafe.Pointer(&info[0])), syscall.WEXITED|wNoWait, 0, 0)
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			return e
		}
		return nil
	}
}
