//go:build (!amd64 && !arm64) || purego

package kernel

func simdKernels() []microkernel { return nil }
