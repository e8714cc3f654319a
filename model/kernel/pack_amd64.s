//go:build !purego

#include "textflag.h"

// func transpose4(dst *float32, w int, src *float32, ld int, groups int)
//
// For each of groups steps of four: reads four values from each of four
// rows of src (ld floats apart) and writes them as four steps of dst (w
// floats apart), four adjacent values each: a 4×4 transpose in SSE registers.
TEXT ·transpose4(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ w+8(FP), R8
	SHLQ $2, R8
	MOVQ src+16(FP), SI
	MOVQ ld+24(FP), R9
	SHLQ $2, R9
	MOVQ groups+32(FP), CX
	LEAQ (R9)(R9*2), R10
	LEAQ (R8)(R8*2), R11

loop:
	TESTQ CX, CX
	JZ    done
	MOVUPS (SI), X0
	MOVUPS (SI)(R9*1), X1
	MOVUPS (SI)(R9*2), X2
	MOVUPS (SI)(R10*1), X3
	MOVAPS   X0, X4
	UNPCKLPS X1, X4
	UNPCKHPS X1, X0
	MOVAPS   X2, X5
	UNPCKLPS X3, X5
	UNPCKHPS X3, X2
	MOVAPS   X4, X6
	MOVLHPS  X5, X6
	MOVHLPS  X4, X5
	MOVAPS   X0, X7
	MOVLHPS  X2, X7
	MOVHLPS  X0, X2
	MOVUPS   X6, (DI)
	MOVUPS   X5, (DI)(R8*1)
	MOVUPS   X7, (DI)(R8*2)
	MOVUPS   X2, (DI)(R11*1)
	ADDQ     $16, SI
	LEAQ     (DI)(R8*4), DI
	DECQ     CX
	JMP      loop

done:
	RET
