//go:build !purego

#include "textflag.h"

// func addScaledAVX2(sum *float64, x *float32, n int, w float64)
//
// sum[i] += w·float64(x[i]) for n values, n a multiple of 8: the widening
// is exact, the product and the sum are each rounded once, as in Go (no
// fused multiply-add).
TEXT ·addScaledAVX2(SB), NOSPLIT, $0-32
	MOVQ         sum+0(FP), DI
	MOVQ         x+8(FP), SI
	MOVQ         n+16(FP), CX
	VBROADCASTSD w+24(FP), Y0

loop:
	TESTQ     CX, CX
	JZ        done
	VCVTPS2PD (SI), Y1
	VCVTPS2PD 16(SI), Y2
	VMULPD    Y0, Y1, Y1
	VMULPD    Y0, Y2, Y2
	VADDPD    (DI), Y1, Y1
	VADDPD    32(DI), Y2, Y2
	VMOVUPD   Y1, (DI)
	VMOVUPD   Y2, 32(DI)
	ADDQ      $32, SI
	ADDQ      $64, DI
	SUBQ      $8, CX
	JMP       loop

done:
	VZEROUPPER
	RET
