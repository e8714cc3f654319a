//go:build !purego

package kernel

import "golang.org/x/sys/cpu"

// gen_arm64.go is a program for the host: GOARCH names the target here.
//go:generate env -u GOARCH go run gen_arm64.go

//go:noescape
func sgemmNEON(kc int, a, b, c *float32, ldc int, load bool)

// simdKernels lists the microkernels this CPU can run, fastest first.
//
// NEON's 8×12 tile takes 24 of the 32 vector registers for C, 2 for A and 3
// for B: 24 fused multiply-adds per 5 vector loads. The cache blocks are for
// a phone or server core (Cortex-A55/A76/A78, Neoverse N1/V1): each kernel
// call streams a kc×12 sliver of B (12 KB at kc = 256) that stays in a
// 32–64 KB L1 while the mc×kc block of A (128 KB at mc = 128) stays in a
// 256 KB–1 MB L2; the kc×nc panel of B (about 1 MB) is for the L3 or system
// cache, and mc·nc·kc ≈ 2^25 is blockWork, so the driver need not cut it.
func simdKernels() []microkernel {
	if !cpu.ARM64.HasASIMD {
		return nil
	}
	return []microkernel{{name: "neon", mr: 8, nr: 12, kc: 256, mc: 128, nc: 1020, run: sgemmNEON}}
}
