//go:build !purego

#include "textflag.h"

// AVX2 cores of elementwise.go, without FMA: each instruction is the
// correctly rounded operation the Go reference does at that step, so the
// results match it bit for bit. Lengths are multiples of 16 (the Go wrappers
// do the tail). Constants are replicated 8 times so they can be memory
// operands.

DATA elemc<>+0(SB)/4, $0xc2d00000
DATA elemc<>+4(SB)/4, $0xc2d00000
DATA elemc<>+8(SB)/4, $0xc2d00000
DATA elemc<>+12(SB)/4, $0xc2d00000
DATA elemc<>+16(SB)/4, $0xc2d00000
DATA elemc<>+20(SB)/4, $0xc2d00000
DATA elemc<>+24(SB)/4, $0xc2d00000
DATA elemc<>+28(SB)/4, $0xc2d00000
DATA elemc<>+32(SB)/4, $0x42b20000
DATA elemc<>+36(SB)/4, $0x42b20000
DATA elemc<>+40(SB)/4, $0x42b20000
DATA elemc<>+44(SB)/4, $0x42b20000
DATA elemc<>+48(SB)/4, $0x42b20000
DATA elemc<>+52(SB)/4, $0x42b20000
DATA elemc<>+56(SB)/4, $0x42b20000
DATA elemc<>+60(SB)/4, $0x42b20000
DATA elemc<>+64(SB)/4, $0x3fb8aa3b
DATA elemc<>+68(SB)/4, $0x3fb8aa3b
DATA elemc<>+72(SB)/4, $0x3fb8aa3b
DATA elemc<>+76(SB)/4, $0x3fb8aa3b
DATA elemc<>+80(SB)/4, $0x3fb8aa3b
DATA elemc<>+84(SB)/4, $0x3fb8aa3b
DATA elemc<>+88(SB)/4, $0x3fb8aa3b
DATA elemc<>+92(SB)/4, $0x3fb8aa3b
DATA elemc<>+96(SB)/4, $0x3f318000
DATA elemc<>+100(SB)/4, $0x3f318000
DATA elemc<>+104(SB)/4, $0x3f318000
DATA elemc<>+108(SB)/4, $0x3f318000
DATA elemc<>+112(SB)/4, $0x3f318000
DATA elemc<>+116(SB)/4, $0x3f318000
DATA elemc<>+120(SB)/4, $0x3f318000
DATA elemc<>+124(SB)/4, $0x3f318000
DATA elemc<>+128(SB)/4, $0xb95e8083
DATA elemc<>+132(SB)/4, $0xb95e8083
DATA elemc<>+136(SB)/4, $0xb95e8083
DATA elemc<>+140(SB)/4, $0xb95e8083
DATA elemc<>+144(SB)/4, $0xb95e8083
DATA elemc<>+148(SB)/4, $0xb95e8083
DATA elemc<>+152(SB)/4, $0xb95e8083
DATA elemc<>+156(SB)/4, $0xb95e8083
DATA elemc<>+160(SB)/4, $0x39506967
DATA elemc<>+164(SB)/4, $0x39506967
DATA elemc<>+168(SB)/4, $0x39506967
DATA elemc<>+172(SB)/4, $0x39506967
DATA elemc<>+176(SB)/4, $0x39506967
DATA elemc<>+180(SB)/4, $0x39506967
DATA elemc<>+184(SB)/4, $0x39506967
DATA elemc<>+188(SB)/4, $0x39506967
DATA elemc<>+192(SB)/4, $0x3ab743ce
DATA elemc<>+196(SB)/4, $0x3ab743ce
DATA elemc<>+200(SB)/4, $0x3ab743ce
DATA elemc<>+204(SB)/4, $0x3ab743ce
DATA elemc<>+208(SB)/4, $0x3ab743ce
DATA elemc<>+212(SB)/4, $0x3ab743ce
DATA elemc<>+216(SB)/4, $0x3ab743ce
DATA elemc<>+220(SB)/4, $0x3ab743ce
DATA elemc<>+224(SB)/4, $0x3c088908
DATA elemc<>+228(SB)/4, $0x3c088908
DATA elemc<>+232(SB)/4, $0x3c088908
DATA elemc<>+236(SB)/4, $0x3c088908
DATA elemc<>+240(SB)/4, $0x3c088908
DATA elemc<>+244(SB)/4, $0x3c088908
DATA elemc<>+248(SB)/4, $0x3c088908
DATA elemc<>+252(SB)/4, $0x3c088908
DATA elemc<>+256(SB)/4, $0x3d2aa9c1
DATA elemc<>+260(SB)/4, $0x3d2aa9c1
DATA elemc<>+264(SB)/4, $0x3d2aa9c1
DATA elemc<>+268(SB)/4, $0x3d2aa9c1
DATA elemc<>+272(SB)/4, $0x3d2aa9c1
DATA elemc<>+276(SB)/4, $0x3d2aa9c1
DATA elemc<>+280(SB)/4, $0x3d2aa9c1
DATA elemc<>+284(SB)/4, $0x3d2aa9c1
DATA elemc<>+288(SB)/4, $0x3e2aaaaa
DATA elemc<>+292(SB)/4, $0x3e2aaaaa
DATA elemc<>+296(SB)/4, $0x3e2aaaaa
DATA elemc<>+300(SB)/4, $0x3e2aaaaa
DATA elemc<>+304(SB)/4, $0x3e2aaaaa
DATA elemc<>+308(SB)/4, $0x3e2aaaaa
DATA elemc<>+312(SB)/4, $0x3e2aaaaa
DATA elemc<>+316(SB)/4, $0x3e2aaaaa
DATA elemc<>+320(SB)/4, $0x3f000000
DATA elemc<>+324(SB)/4, $0x3f000000
DATA elemc<>+328(SB)/4, $0x3f000000
DATA elemc<>+332(SB)/4, $0x3f000000
DATA elemc<>+336(SB)/4, $0x3f000000
DATA elemc<>+340(SB)/4, $0x3f000000
DATA elemc<>+344(SB)/4, $0x3f000000
DATA elemc<>+348(SB)/4, $0x3f000000
DATA elemc<>+352(SB)/4, $0x3f800000
DATA elemc<>+356(SB)/4, $0x3f800000
DATA elemc<>+360(SB)/4, $0x3f800000
DATA elemc<>+364(SB)/4, $0x3f800000
DATA elemc<>+368(SB)/4, $0x3f800000
DATA elemc<>+372(SB)/4, $0x3f800000
DATA elemc<>+376(SB)/4, $0x3f800000
DATA elemc<>+380(SB)/4, $0x3f800000
DATA elemc<>+384(SB)/4, $0x3d372713
DATA elemc<>+388(SB)/4, $0x3d372713
DATA elemc<>+392(SB)/4, $0x3d372713
DATA elemc<>+396(SB)/4, $0x3d372713
DATA elemc<>+400(SB)/4, $0x3d372713
DATA elemc<>+404(SB)/4, $0x3d372713
DATA elemc<>+408(SB)/4, $0x3d372713
DATA elemc<>+412(SB)/4, $0x3d372713
DATA elemc<>+416(SB)/4, $0x3fcc422a
DATA elemc<>+420(SB)/4, $0x3fcc422a
DATA elemc<>+424(SB)/4, $0x3fcc422a
DATA elemc<>+428(SB)/4, $0x3fcc422a
DATA elemc<>+432(SB)/4, $0x3fcc422a
DATA elemc<>+436(SB)/4, $0x3fcc422a
DATA elemc<>+440(SB)/4, $0x3fcc422a
DATA elemc<>+444(SB)/4, $0x3fcc422a
DATA elemc<>+448(SB)/4, $0x3e095d4f
DATA elemc<>+452(SB)/4, $0x3e095d4f
DATA elemc<>+456(SB)/4, $0x3e095d4f
DATA elemc<>+460(SB)/4, $0x3e095d4f
DATA elemc<>+464(SB)/4, $0x3e095d4f
DATA elemc<>+468(SB)/4, $0x3e095d4f
DATA elemc<>+472(SB)/4, $0x3e095d4f
DATA elemc<>+476(SB)/4, $0x3e095d4f
DATA elemc<>+480(SB)/4, $0x461c4000
DATA elemc<>+484(SB)/4, $0x461c4000
DATA elemc<>+488(SB)/4, $0x461c4000
DATA elemc<>+492(SB)/4, $0x461c4000
DATA elemc<>+496(SB)/4, $0x461c4000
DATA elemc<>+500(SB)/4, $0x461c4000
DATA elemc<>+504(SB)/4, $0x461c4000
DATA elemc<>+508(SB)/4, $0x461c4000
DATA elemc<>+512(SB)/4, $0xc61c4000
DATA elemc<>+516(SB)/4, $0xc61c4000
DATA elemc<>+520(SB)/4, $0xc61c4000
DATA elemc<>+524(SB)/4, $0xc61c4000
DATA elemc<>+528(SB)/4, $0xc61c4000
DATA elemc<>+532(SB)/4, $0xc61c4000
DATA elemc<>+536(SB)/4, $0xc61c4000
DATA elemc<>+540(SB)/4, $0xc61c4000
DATA elemc<>+544(SB)/4, $127
DATA elemc<>+548(SB)/4, $127
DATA elemc<>+552(SB)/4, $127
DATA elemc<>+556(SB)/4, $127
DATA elemc<>+560(SB)/4, $127
DATA elemc<>+564(SB)/4, $127
DATA elemc<>+568(SB)/4, $127
DATA elemc<>+572(SB)/4, $127
DATA elemc<>+576(SB)/4, $0x7fffffff
DATA elemc<>+580(SB)/4, $0x7fffffff
DATA elemc<>+584(SB)/4, $0x7fffffff
DATA elemc<>+588(SB)/4, $0x7fffffff
DATA elemc<>+592(SB)/4, $0x7fffffff
DATA elemc<>+596(SB)/4, $0x7fffffff
DATA elemc<>+600(SB)/4, $0x7fffffff
DATA elemc<>+604(SB)/4, $0x7fffffff
DATA elemc<>+608(SB)/4, $0x80000000
DATA elemc<>+612(SB)/4, $0x80000000
DATA elemc<>+616(SB)/4, $0x80000000
DATA elemc<>+620(SB)/4, $0x80000000
DATA elemc<>+624(SB)/4, $0x80000000
DATA elemc<>+628(SB)/4, $0x80000000
DATA elemc<>+632(SB)/4, $0x80000000
DATA elemc<>+636(SB)/4, $0x80000000
GLOBL elemc<>(SB), RODATA|NOPTR, $640

#define C_LO elemc<>+0(SB)
#define C_HI elemc<>+32(SB)
#define C_LOG2E elemc<>+64(SB)
#define C_C1 elemc<>+96(SB)
#define C_C2 elemc<>+128(SB)
#define C_P0 elemc<>+160(SB)
#define C_P1 elemc<>+192(SB)
#define C_P2 elemc<>+224(SB)
#define C_P3 elemc<>+256(SB)
#define C_P4 elemc<>+288(SB)
#define C_P5 elemc<>+320(SB)
#define C_ONE elemc<>+352(SB)
#define C_GELUK elemc<>+384(SB)
#define C_GELU2C elemc<>+416(SB)
#define C_GELU3K elemc<>+448(SB)
#define C_GELUMAX elemc<>+480(SB)
#define C_GELUMIN elemc<>+512(SB)
#define C_I127 elemc<>+544(SB)
#define C_ABS elemc<>+576(SB)
#define C_SIGN elemc<>+608(SB)

// LOADEXP puts the registers EXP8 expects: Y15 = −104, Y14 = 89, Y13 = 1.
#define LOADEXP \
	VMOVUPS C_LO, Y15; \
	VMOVUPS C_HI, Y14; \
	VMOVUPS C_ONE, Y13

// EXP8 is exp32 on the 8 lanes of X, with temporaries T1-T3. The clamps
// take x as their second source, so a NaN passes through as in Go.
#define EXP8(X, T1, T2, T3) \
	VMAXPS X, Y15, X; \
	VMINPS X, Y14, X; \
	VMULPS C_LOG2E, X, T1; \
	VCVTPS2DQ T1, T1; \
	VCVTDQ2PS T1, T2; \
	VMULPS C_C1, T2, T3; \
	VSUBPS T3, X, X; \
	VMULPS C_C2, T2, T3; \
	VSUBPS T3, X, X; \
	VMULPS X, X, T2; \
	VMULPS C_P0, X, T3; \
	VADDPS C_P1, T3, T3; \
	VMULPS X, T3, T3; \
	VADDPS C_P2, T3, T3; \
	VMULPS X, T3, T3; \
	VADDPS C_P3, T3, T3; \
	VMULPS X, T3, T3; \
	VADDPS C_P4, T3, T3; \
	VMULPS X, T3, T3; \
	VADDPS C_P5, T3, T3; \
	VMULPS T2, T3, T3; \
	VADDPS X, T3, T3; \
	VADDPS Y13, T3, T3; \
	VPSRAD $1, T1, T2; \
	VPSUBD T2, T1, T1; \
	VPADDD C_I127, T2, T2; \
	VPSLLD $23, T2, T2; \
	VPADDD C_I127, T1, T1; \
	VPSLLD $23, T1, T1; \
	VMULPS T2, T3, T3; \
	VMULPS T1, T3, X

// SIGMOID2U takes x in X and leaves 2u in A, e = exp(−|2u|) in E, d = 1+e
// in D and σ(2u) in S. Temporaries: Y0-Y2.
#define SIGMOID2U(X, A, E, D, S) \
	VMULPS X, X, A; \
	VMULPS X, A, A; \
	VMULPS C_GELUK, A, A; \
	VADDPS X, A, A; \
	VMULPS C_GELU2C, A, A; \
	VORPS C_SIGN, A, E; \
	EXP8(E, Y0, Y1, Y2); \
	VADDPS Y13, E, D; \
	VBLENDVPS A, E, Y13, S; \
	VDIVPS D, S, S

// func geluAVX2(x, y []float32)
TEXT ·geluAVX2(SB), NOSPLIT, $0-48
	MOVQ x_base+0(FP), SI
	MOVQ x_len+8(FP), CX
	MOVQ y_base+24(FP), DI
	LOADEXP
	SHRQ $3, CX
gelu_loop:
	VMOVUPS (SI), Y4
	SIGMOID2U(Y4, Y5, Y6, Y7, Y8)
	VMULPS Y8, Y4, Y4
	VMOVUPS Y4, (DI)
	ADDQ $32, SI
	ADDQ $32, DI
	DECQ CX
	JNZ gelu_loop
	VZEROUPPER
	RET

// func geluGradAVX2(dy, x, dx []float32)
TEXT ·geluGradAVX2(SB), NOSPLIT, $0-72
	MOVQ dy_base+0(FP), DX
	MOVQ dy_len+8(FP), CX
	MOVQ x_base+24(FP), SI
	MOVQ dx_base+48(FP), DI
	LOADEXP
	VMOVUPS C_GELUMIN, Y12
	VMOVUPS C_GELUMAX, Y11
	SHRQ $3, CX
gelugrad_loop:
	VMOVUPS (SI), Y4
	VMAXPS Y4, Y12, Y4
	VMINPS Y4, Y11, Y4
	SIGMOID2U(Y4, Y5, Y6, Y7, Y8)
	// ed2 = (e·(1/d))·(1/d)
	VDIVPS Y7, Y13, Y3
	VMULPS Y3, Y6, Y6
	VMULPS Y3, Y6, Y6
	// du = 2C·(1 + 3K·x²)
	VMULPS Y4, Y4, Y9
	VMULPS C_GELU3K, Y9, Y9
	VADDPS Y13, Y9, Y9
	VMULPS C_GELU2C, Y9, Y9
	// σ + (ed2·x)·du, times dy
	VMULPS Y4, Y6, Y6
	VMULPS Y9, Y6, Y6
	VADDPS Y6, Y8, Y8
	VMULPS (DX), Y8, Y8
	VMOVUPS Y8, (DI)
	ADDQ $32, SI
	ADDQ $32, DX
	ADDQ $32, DI
	DECQ CX
	JNZ gelugrad_loop
	VZEROUPPER
	RET

// func maxAVX2(x []float32) float32
TEXT ·maxAVX2(SB), NOSPLIT, $0-28
	MOVQ x_base+0(FP), SI
	MOVQ x_len+8(FP), CX
	VMOVUPS (SI), Y0
	VMOVUPS 32(SI), Y1
	ADDQ $64, SI
	SHRQ $4, CX
	DECQ CX
	JZ max_reduce
max_loop:
	VMAXPS (SI), Y0, Y0
	VMAXPS 32(SI), Y1, Y1
	ADDQ $64, SI
	DECQ CX
	JNZ max_loop
max_reduce:
	VMAXPS Y1, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VMAXPS X1, X0, X0
	VMOVHLPS X0, X1, X1
	VMAXPS X1, X0, X0
	VPSHUFD $1, X0, X1
	VMAXSS X1, X0, X0
	VZEROUPPER
	MOVSS X0, ret+24(FP)
	RET

// func expSumAVX2(x, y []float32, m float32, lanes *[16]float32)
TEXT ·expSumAVX2(SB), NOSPLIT, $0-64
	MOVQ x_base+0(FP), SI
	MOVQ x_len+8(FP), CX
	MOVQ y_base+24(FP), DI
	VBROADCASTSS m+48(FP), Y10
	MOVQ lanes+56(FP), AX
	LOADEXP
	VMOVUPS (AX), Y8
	VMOVUPS 32(AX), Y9
	SHRQ $4, CX
expsum_loop:
	VMOVUPS (SI), Y4
	VSUBPS Y10, Y4, Y4
	EXP8(Y4, Y0, Y1, Y2)
	VMOVUPS 32(SI), Y5
	VSUBPS Y10, Y5, Y5
	EXP8(Y5, Y0, Y1, Y2)
	VMOVUPS Y4, (DI)
	VMOVUPS Y5, 32(DI)
	VADDPS Y4, Y8, Y8
	VADDPS Y5, Y9, Y9
	ADDQ $64, SI
	ADDQ $64, DI
	DECQ CX
	JNZ expsum_loop
	VMOVUPS Y8, (AX)
	VMOVUPS Y9, 32(AX)
	VZEROUPPER
	RET

// func divAVX2(y []float32, s float32)
TEXT ·divAVX2(SB), NOSPLIT, $0-28
	MOVQ y_base+0(FP), DI
	MOVQ y_len+8(FP), CX
	VBROADCASTSS s+24(FP), Y2
	SHRQ $4, CX
div_loop:
	VMOVUPS (DI), Y0
	VMOVUPS 32(DI), Y1
	VDIVPS Y2, Y0, Y0
	VDIVPS Y2, Y1, Y1
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	ADDQ $64, DI
	DECQ CX
	JNZ div_loop
	VZEROUPPER
	RET

// func axpyAVX2(alpha float32, x, y []float32)
TEXT ·axpyAVX2(SB), NOSPLIT, $0-56
	VBROADCASTSS alpha+0(FP), Y2
	MOVQ x_base+8(FP), SI
	MOVQ x_len+16(FP), CX
	MOVQ y_base+32(FP), DI
	SHRQ $4, CX
axpy_loop:
	VMULPS (SI), Y2, Y0
	VMULPS 32(SI), Y2, Y1
	VADDPS (DI), Y0, Y0
	VADDPS 32(DI), Y1, Y1
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	ADDQ $64, SI
	ADDQ $64, DI
	DECQ CX
	JNZ axpy_loop
	VZEROUPPER
	RET

// func addAVX2(x, y []float32)
TEXT ·addAVX2(SB), NOSPLIT, $0-48
	MOVQ x_base+0(FP), SI
	MOVQ x_len+8(FP), CX
	MOVQ y_base+24(FP), DI
	SHRQ $4, CX
add_loop:
	VMOVUPS (DI), Y0
	VMOVUPS 32(DI), Y1
	VADDPS (SI), Y0, Y0
	VADDPS 32(SI), Y1, Y1
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	ADDQ $64, SI
	ADDQ $64, DI
	DECQ CX
	JNZ add_loop
	VZEROUPPER
	RET

// func scaleAVX2(alpha float32, x []float32)
TEXT ·scaleAVX2(SB), NOSPLIT, $0-32
	VBROADCASTSS alpha+0(FP), Y2
	MOVQ x_base+8(FP), DI
	MOVQ x_len+16(FP), CX
	SHRQ $4, CX
scale_loop:
	VMULPS (DI), Y2, Y0
	VMULPS 32(DI), Y2, Y1
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	ADDQ $64, DI
	DECQ CX
	JNZ scale_loop
	VZEROUPPER
	RET

// func reluAVX2(x, y []float32)
// max with x first and 0 second: x > 0 ? x : 0, so NaN and −0 give +0.
TEXT ·reluAVX2(SB), NOSPLIT, $0-48
	MOVQ x_base+0(FP), SI
	MOVQ x_len+8(FP), CX
	MOVQ y_base+24(FP), DI
	VXORPS Y2, Y2, Y2
	SHRQ $4, CX
relu_loop:
	VMOVUPS (SI), Y0
	VMOVUPS 32(SI), Y1
	VMAXPS Y2, Y0, Y0
	VMAXPS Y2, Y1, Y1
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	ADDQ $64, SI
	ADDQ $64, DI
	DECQ CX
	JNZ relu_loop
	VZEROUPPER
	RET

// func reluGradAVX2(dy, x, dx []float32)
TEXT ·reluGradAVX2(SB), NOSPLIT, $0-72
	MOVQ dy_base+0(FP), DX
	MOVQ dy_len+8(FP), CX
	MOVQ x_base+24(FP), SI
	MOVQ dx_base+48(FP), DI
	VXORPS Y4, Y4, Y4
	SHRQ $4, CX
relugrad_loop:
	VMOVUPS (SI), Y0
	VMOVUPS 32(SI), Y1
	// x > 0 (ordered, so NaN gives false)
	VCMPPS $0x1e, Y4, Y0, Y0
	VCMPPS $0x1e, Y4, Y1, Y1
	VANDPS (DX), Y0, Y0
	VANDPS 32(DX), Y1, Y1
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	ADDQ $64, SI
	ADDQ $64, DX
	ADDQ $64, DI
	DECQ CX
	JNZ relugrad_loop
	VZEROUPPER
	RET

// func adamwAVX2(p, g, m, v []float32, c *adamConst)
// Four values at a time in float64, as the Go reference computes.
TEXT ·adamwAVX2(SB), NOSPLIT, $0-104
	MOVQ p_base+0(FP), DI
	MOVQ g_base+24(FP), SI
	MOVQ g_len+32(FP), CX
	MOVQ m_base+48(FP), R8
	MOVQ v_base+72(FP), R9
	MOVQ c+96(FP), AX
	VBROADCASTSD 0(AX), Y6
	VBROADCASTSD 8(AX), Y7
	VBROADCASTSD 16(AX), Y8
	VBROADCASTSD 24(AX), Y9
	VBROADCASTSD 32(AX), Y10
	VBROADCASTSD 40(AX), Y11
	VBROADCASTSD 48(AX), Y12
	VBROADCASTSD 56(AX), Y13
	VBROADCASTSD 64(AX), Y14
	SHRQ $2, CX
adamw_loop:
	VCVTPS2PD (SI), Y0
	// m ← f32(b1·m + (1−b1)·g)
	VCVTPS2PD (R8), Y1
	VMULPD Y6, Y1, Y1
	VMULPD Y7, Y0, Y2
	VADDPD Y2, Y1, Y1
	VCVTPD2PSY Y1, X1
	VMOVUPS X1, (R8)
	VCVTPS2PD X1, Y1
	// v ← f32(b2·v + (1−b2)·g²)
	VMULPD Y0, Y0, Y2
	VMULPD Y9, Y2, Y2
	VCVTPS2PD (R9), Y3
	VMULPD Y8, Y3, Y3
	VADDPD Y2, Y3, Y3
	VCVTPD2PSY Y3, X3
	VMOVUPS X3, (R9)
	VCVTPS2PD X3, Y3
	// upd = (m·c1)/(√(v·c2) + eps) + wd·p
	VMULPD Y10, Y1, Y1
	VMULPD Y11, Y3, Y3
	VSQRTPD Y3, Y3
	VADDPD Y13, Y3, Y3
	VDIVPD Y3, Y1, Y1
	VCVTPS2PD (DI), Y4
	VMULPD Y14, Y4, Y5
	VADDPD Y5, Y1, Y1
	// p ← f32(p − lr·upd)
	VMULPD Y12, Y1, Y1
	VSUBPD Y1, Y4, Y4
	VCVTPD2PSY Y4, X4
	VMOVUPS X4, (DI)
	ADDQ $16, SI
	ADDQ $16, DI
	ADDQ $16, R8
	ADDQ $16, R9
	DECQ CX
	JNZ adamw_loop
	VZEROUPPER
	RET

// func lnNormAVX2(x, gamma, beta, y []float32, mu, rs float64)
TEXT ·lnNormAVX2(SB), NOSPLIT, $0-112
	MOVQ x_base+0(FP), SI
	MOVQ x_len+8(FP), CX
	MOVQ gamma_base+24(FP), R8
	MOVQ beta_base+48(FP), R9
	MOVQ y_base+72(FP), DI
	VBROADCASTSD mu+96(FP), Y6
	VBROADCASTSD rs+104(FP), Y7
	SHRQ $2, CX
lnnorm_loop:
	VCVTPS2PD (SI), Y0
	VSUBPD Y6, Y0, Y0
	VMULPD Y7, Y0, Y0
	VCVTPS2PD (R8), Y1
	VMULPD Y1, Y0, Y0
	VCVTPS2PD (R9), Y2
	VADDPD Y2, Y0, Y0
	VCVTPD2PSY Y0, X0
	VMOVUPS X0, (DI)
	ADDQ $16, SI
	ADDQ $16, R8
	ADDQ $16, R9
	ADDQ $16, DI
	DECQ CX
	JNZ lnnorm_loop
	VZEROUPPER
	RET
