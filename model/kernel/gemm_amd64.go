//go:build !purego

package kernel

import "golang.org/x/sys/cpu"

//go:generate go run gen_amd64.go

//go:noescape
func sgemmAVX2r2(kc int, a, b, c *float32, ldc int, load bool)

//go:noescape
func sgemmAVX2r2B(kc int, a, b *float32, ldb int, c *float32, ldc int, load bool)

//go:noescape
func sgemmAVX2r4(kc int, a, b, c *float32, ldc int, load bool)

//go:noescape
func sgemmAVX2r4B(kc int, a, b *float32, ldb int, c *float32, ldc int, load bool)

//go:noescape
func sgemmAVX2(kc int, a, b, c *float32, ldc int, load bool)

//go:noescape
func sgemmAVX2B(kc int, a, b *float32, ldb int, c *float32, ldc int, load bool)

//go:noescape
func sgemmAVX512r4(kc int, a, b, c *float32, ldc int, load bool)

//go:noescape
func sgemmAVX512r4B(kc int, a, b *float32, ldb int, c *float32, ldc int, load bool)

//go:noescape
func sgemmAVX512r8(kc int, a, b, c *float32, ldc int, load bool)

//go:noescape
func sgemmAVX512r8B(kc int, a, b *float32, ldb int, c *float32, ldc int, load bool)

//go:noescape
func sgemmAVX512(kc int, a, b, c *float32, ldc int, load bool)

//go:noescape
func sgemmAVX512B(kc int, a, b *float32, ldb int, c *float32, ldc int, load bool)

// simdKernels lists the microkernels this CPU can run, fastest first.
func simdKernels() []microkernel {
	var ks []microkernel
	if cpu.X86.HasAVX512F {
		ks = append(ks, microkernel{name: "avx512", mr: 12, nr: 32, kc: 256, mc: 192, nc: 3072, run: sgemmAVX512, runB: sgemmAVX512B,
			fewer: []tile{{4, sgemmAVX512r4, sgemmAVX512r4B}, {8, sgemmAVX512r8, sgemmAVX512r8B}}})
	}
	if cpu.X86.HasAVX2 && cpu.X86.HasFMA {
		ks = append(ks, microkernel{name: "avx2+fma", mr: 6, nr: 16, kc: 256, mc: 168, nc: 3072, run: sgemmAVX2, runB: sgemmAVX2B,
			fewer: []tile{{2, sgemmAVX2r2, sgemmAVX2r2B}, {4, sgemmAVX2r4, sgemmAVX2r4B}}})
	}
	return ks
}
