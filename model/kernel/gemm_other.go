//go:build !amd64 && !arm64

package kernel

func simdKernels() []microkernel { return nil }
