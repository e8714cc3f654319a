#!/usr/bin/env python3
# Writes elementwise_arm64.s: the NEON cores, encoded as WORDs by llvm-mc
# (Go's assembler lacks most NEON floating-point instructions).
# Run from model/kernel: python3 gen_elementwise_arm64.py elementwise_arm64.s
import subprocess, re, sys
consts = [("lo",0xc2d00000),("hi",0x42b20000),("log2e",0x3fb8aa3b),("c1",0x3f318000),("c2",0xb95e8083),
 ("p0",0x39506967),("p1",0x3ab743ce),("p2",0x3c088908),("p3",0x3d2aa9c1),("p4",0x3e2aaaaa),("p5",0x3f000000),
 ("one",0x3f800000),("geluK",0x3d372713),("gelu2C",0x3fcc422a),("gelu3K",0x3e095d4f),("geluMax",0x461c4000),
 ("geluMin",0xc61c4000),("i127",127),("sign",0x80000000)]
R = {n: "v%d" % (13+i) for i,(n,_) in enumerate(consts)}
out = []
insns = []
def N(s):  # a NEON instruction encoded as WORD
    insns.append(s); out.append(("W", s))
def G(s):  # a Go assembler line
    out.append(("G", s))
def loadconsts():
    G("MOVD $elemc<>(SB), R9")
    for n,_ in consts:
        N("ld1r {%s.4s}, [x9], #4" % R[n])
def exp4(x, t1, t2, t3):
    c = R
    N(f"fmax {x}.4s, {x}.4s, {c['lo']}.4s")
    N(f"fmin {x}.4s, {x}.4s, {c['hi']}.4s")
    N(f"fmul {t1}.4s, {x}.4s, {c['log2e']}.4s")
    N(f"fcvtns {t1}.4s, {t1}.4s")
    N(f"scvtf {t2}.4s, {t1}.4s")
    N(f"fmul {t3}.4s, {t2}.4s, {c['c1']}.4s")
    N(f"fsub {x}.4s, {x}.4s, {t3}.4s")
    N(f"fmul {t3}.4s, {t2}.4s, {c['c2']}.4s")
    N(f"fsub {x}.4s, {x}.4s, {t3}.4s")
    N(f"fmul {t2}.4s, {x}.4s, {x}.4s")
    N(f"fmul {t3}.4s, {x}.4s, {c['p0']}.4s")
    N(f"fadd {t3}.4s, {t3}.4s, {c['p1']}.4s")
    for p in ["p2","p3","p4","p5"]:
        N(f"fmul {t3}.4s, {t3}.4s, {x}.4s")
        N(f"fadd {t3}.4s, {t3}.4s, {c[p]}.4s")
    N(f"fmul {t3}.4s, {t3}.4s, {t2}.4s")
    N(f"fadd {t3}.4s, {t3}.4s, {x}.4s")
    N(f"fadd {t3}.4s, {t3}.4s, {c['one']}.4s")
    N(f"sshr {t2}.4s, {t1}.4s, #1")
    N(f"sub {t1}.4s, {t1}.4s, {t2}.4s")
    N(f"add {t2}.4s, {t2}.4s, {c['i127']}.4s")
    N(f"shl {t2}.4s, {t2}.4s, #23")
    N(f"add {t1}.4s, {t1}.4s, {c['i127']}.4s")
    N(f"shl {t1}.4s, {t1}.4s, #23")
    N(f"fmul {t3}.4s, {t3}.4s, {t2}.4s")
    N(f"fmul {x}.4s, {t3}.4s, {t1}.4s")
def sigmoid2u(x, a, e, d, s):
    # 2u in a, e = exp(-|2u|), d = 1+e, s = sigma(2u); temporaries v0-v2
    c = R
    N(f"fmul {a}.4s, {x}.4s, {x}.4s")
    N(f"fmul {a}.4s, {a}.4s, {x}.4s")
    N(f"fmul {a}.4s, {a}.4s, {c['geluK']}.4s")
    N(f"fadd {a}.4s, {x}.4s, {a}.4s")
    N(f"fmul {a}.4s, {a}.4s, {c['gelu2C']}.4s")
    N(f"orr {e}.16b, {a}.16b, {c['sign']}.16b")
    exp4(e, "v0", "v1", "v2")
    N(f"fadd {d}.4s, {e}.4s, {c['one']}.4s")
    N(f"sshr {s}.4s, {a}.4s, #31")
    N(f"bsl {s}.16b, {e}.16b, {c['one']}.16b")
    N(f"fdiv {s}.4s, {s}.4s, {d}.4s")
def text(name, frame, doc):
    G("")
    G("// " + doc)
    G(f"TEXT ·{name}(SB), NOSPLIT, $0-{frame}")
def loop(label, step_reg="R3"):
    G(f"{label}:")
def endloop(label, reg="R3"):
    G(f"SUBS $1, {reg}, {reg}")
    G(f"BNE {label}")

# gelu
text("geluNEON", 48, "func geluNEON(x, y []float32)")
G("MOVD x_base+0(FP), R0"); G("MOVD x_len+8(FP), R3"); G("MOVD y_base+24(FP), R1")
loadconsts(); G("LSR $2, R3, R3")
loop("gelu_loop")
N("ld1 {v4.4s}, [x0], #16")
sigmoid2u("v4","v5","v6","v7","v8")
N("fmul v4.4s, v4.4s, v8.4s")
N("st1 {v4.4s}, [x1], #16")
endloop("gelu_loop"); G("RET")

# gelu grad
text("geluGradNEON", 72, "func geluGradNEON(dy, x, dx []float32)")
G("MOVD dy_base+0(FP), R2"); G("MOVD dy_len+8(FP), R3"); G("MOVD x_base+24(FP), R0"); G("MOVD dx_base+48(FP), R1")
loadconsts(); G("LSR $2, R3, R3")
loop("gelugrad_loop")
N("ld1 {v4.4s}, [x0], #16")
N(f"fmax v4.4s, v4.4s, {R['geluMin']}.4s")
N(f"fmin v4.4s, v4.4s, {R['geluMax']}.4s")
sigmoid2u("v4","v5","v6","v7","v8")
N(f"fdiv v3.4s, {R['one']}.4s, v7.4s")
N("fmul v6.4s, v6.4s, v3.4s")
N("fmul v6.4s, v6.4s, v3.4s")
N("fmul v9.4s, v4.4s, v4.4s")
N(f"fmul v9.4s, v9.4s, {R['gelu3K']}.4s")
N(f"fadd v9.4s, v9.4s, {R['one']}.4s")
N(f"fmul v9.4s, v9.4s, {R['gelu2C']}.4s")
N("fmul v6.4s, v6.4s, v4.4s")
N("fmul v6.4s, v6.4s, v9.4s")
N("fadd v8.4s, v8.4s, v6.4s")
N("ld1 {v10.4s}, [x2], #16")
N("fmul v8.4s, v10.4s, v8.4s")
N("st1 {v8.4s}, [x1], #16")
endloop("gelugrad_loop"); G("RET")

# max
text("maxNEON", 28, "func maxNEON(x []float32) float32")
G("MOVD x_base+0(FP), R0"); G("MOVD x_len+8(FP), R3")
N("ld1 {v0.4s, v1.4s, v2.4s, v3.4s}, [x0], #64")
G("LSR $4, R3, R3"); G("SUBS $1, R3, R3"); G("BEQ max_reduce")
loop("max_loop")
N("ld1 {v4.4s, v5.4s, v6.4s, v7.4s}, [x0], #64")
for i in range(4): N(f"fmax v{i}.4s, v{i}.4s, v{i+4}.4s")
endloop("max_loop")
G("max_reduce:")
N("fmax v0.4s, v0.4s, v1.4s"); N("fmax v2.4s, v2.4s, v3.4s"); N("fmax v0.4s, v0.4s, v2.4s"); N("fmaxv s0, v0.4s")
G("FMOVS F0, ret+24(FP)"); G("RET")

# expSum: exp pass storing y, then lane sums over y
text("expSumNEON", 64, "func expSumNEON(x, y []float32, m float32, lanes *[16]float32)")
G("MOVD x_base+0(FP), R0"); G("MOVD x_len+8(FP), R3"); G("MOVD y_base+24(FP), R1"); G("MOVD lanes+56(FP), R4")
G("FMOVS m+48(FP), F12"); N("dup v12.4s, v12.s[0]")
loadconsts(); G("MOVD R3, R5"); G("LSR $2, R3, R3")
loop("exp_loop")
N("ld1 {v4.4s}, [x0], #16")
N("fsub v4.4s, v4.4s, v12.4s")
exp4("v4","v0","v1","v2")
N("st1 {v4.4s}, [x1], #16")
endloop("exp_loop")
G("MOVD y_base+24(FP), R1"); G("LSR $4, R5, R3")
N("ld1 {v4.4s, v5.4s, v6.4s, v7.4s}, [x4]")
loop("sum_loop")
N("ld1 {v0.4s, v1.4s, v2.4s, v3.4s}, [x1], #64")
for i in range(4): N(f"fadd v{i+4}.4s, v{i+4}.4s, v{i}.4s")
endloop("sum_loop")
N("st1 {v4.4s, v5.4s, v6.4s, v7.4s}, [x4]")
G("RET")

def simple(name, frame, doc, setup, body, label):
    text(name, frame, doc)
    for s in setup: G(s) if not s.startswith("!") else N(s[1:])
    loop(label)
    for s in body: N(s)
    endloop(label); G("RET")

simple("divNEON", 28, "func divNEON(y []float32, s float32)",
 ["MOVD y_base+0(FP), R0", "MOVD y_len+8(FP), R3", "FMOVS s+24(FP), F8", "!dup v8.4s, v8.s[0]", "LSR $4, R3, R3", "MOVD R0, R1"],
 ["ld1 {v0.4s, v1.4s, v2.4s, v3.4s}, [x0], #64"] + [f"fdiv v{i}.4s, v{i}.4s, v8.4s" for i in range(4)] + ["st1 {v0.4s, v1.4s, v2.4s, v3.4s}, [x1], #64"], "div_loop")
simple("axpyNEON", 56, "func axpyNEON(alpha float32, x, y []float32)",
 ["FMOVS alpha+0(FP), F8", "!dup v8.4s, v8.s[0]", "MOVD x_base+8(FP), R0", "MOVD x_len+16(FP), R3", "MOVD y_base+32(FP), R1", "MOVD R1, R2", "LSR $4, R3, R3"],
 ["ld1 {v0.4s, v1.4s, v2.4s, v3.4s}, [x0], #64", "ld1 {v4.4s, v5.4s, v6.4s, v7.4s}, [x1], #64"] +
 [f"fmul v{i}.4s, v{i}.4s, v8.4s" for i in range(4)] + [f"fadd v{i}.4s, v{i+4}.4s, v{i}.4s" for i in range(4)] +
 ["st1 {v0.4s, v1.4s, v2.4s, v3.4s}, [x2], #64"], "axpy_loop")
simple("addNEON", 48, "func addNEON(x, y []float32)",
 ["MOVD x_base+0(FP), R0", "MOVD x_len+8(FP), R3", "MOVD y_base+24(FP), R1", "MOVD R1, R2", "LSR $4, R3, R3"],
 ["ld1 {v0.4s, v1.4s, v2.4s, v3.4s}, [x0], #64", "ld1 {v4.4s, v5.4s, v6.4s, v7.4s}, [x1], #64"] +
 [f"fadd v{i}.4s, v{i+4}.4s, v{i}.4s" for i in range(4)] + ["st1 {v0.4s, v1.4s, v2.4s, v3.4s}, [x2], #64"], "add_loop")
simple("scaleNEON", 32, "func scaleNEON(alpha float32, x []float32)",
 ["FMOVS alpha+0(FP), F8", "!dup v8.4s, v8.s[0]", "MOVD x_base+8(FP), R0", "MOVD x_len+16(FP), R3", "MOVD R0, R1", "LSR $4, R3, R3"],
 ["ld1 {v0.4s, v1.4s, v2.4s, v3.4s}, [x0], #64"] + [f"fmul v{i}.4s, v{i}.4s, v8.4s" for i in range(4)] + ["st1 {v0.4s, v1.4s, v2.4s, v3.4s}, [x1], #64"], "scale_loop")
simple("reluNEON", 48, "func reluNEON(x, y []float32)\n// x > 0 as a mask (false for NaN and −0), ANDed with x.",
 ["MOVD x_base+0(FP), R0", "MOVD x_len+8(FP), R3", "MOVD y_base+24(FP), R1", "LSR $4, R3, R3"],
 ["ld1 {v0.4s, v1.4s, v2.4s, v3.4s}, [x0], #64"] + [f"fcmgt v{i+4}.4s, v{i}.4s, #0.0" for i in range(4)] +
 [f"and v{i}.16b, v{i}.16b, v{i+4}.16b" for i in range(4)] + ["st1 {v0.4s, v1.4s, v2.4s, v3.4s}, [x1], #64"], "relu_loop")
simple("reluGradNEON", 72, "func reluGradNEON(dy, x, dx []float32)",
 ["MOVD dy_base+0(FP), R2", "MOVD dy_len+8(FP), R3", "MOVD x_base+24(FP), R0", "MOVD dx_base+48(FP), R1", "LSR $4, R3, R3"],
 ["ld1 {v0.4s, v1.4s, v2.4s, v3.4s}, [x0], #64", "ld1 {v4.4s, v5.4s, v6.4s, v7.4s}, [x2], #64"] + [f"fcmgt v{i}.4s, v{i}.4s, #0.0" for i in range(4)] +
 [f"and v{i}.16b, v{i}.16b, v{i+4}.16b" for i in range(4)] + ["st1 {v0.4s, v1.4s, v2.4s, v3.4s}, [x1], #64"], "relugrad_loop")

# adamw, 4 floats per iteration as two pairs of doubles
text("adamwNEON", 104, "func adamwNEON(p, g, m, v []float32, c *adamConst)\n// Four values at a time in float64 (two registers of two), as the Go reference computes.")
G("MOVD p_base+0(FP), R0"); G("MOVD g_base+24(FP), R1"); G("MOVD g_len+32(FP), R3"); G("MOVD m_base+48(FP), R4"); G("MOVD v_base+72(FP), R5"); G("MOVD c+96(FP), R9")
for i in range(9): N(f"ld1r {{v{16+i}.2d}}, [x9], #8")
# v16 b1, v17 ob1, v18 b2, v19 ob2, v20 c1, v21 c2, v22 lr, v23 eps, v24 wd
G("LSR $2, R3, R3")
loop("adamw_loop")
N("ld1 {v0.4s}, [x1], #16")
N("ld1 {v1.4s}, [x4]")
N("ld1 {v2.4s}, [x5]")
N("ld1 {v3.4s}, [x0]")
# g -> v4 (lo), v5 (hi)
N("fcvtl v4.2d, v0.2s"); N("fcvtl2 v5.2d, v0.4s")
# m
N("fcvtl v6.2d, v1.2s"); N("fcvtl2 v7.2d, v1.4s")
for a, g in (("v6","v4"),("v7","v5")):
    N(f"fmul {a}.2d, {a}.2d, v16.2d"); N(f"fmul v8.2d, {g}.2d, v17.2d"); N(f"fadd {a}.2d, {a}.2d, v8.2d")
N("fcvtn v1.2s, v6.2d"); N("fcvtn2 v1.4s, v7.2d")
N("st1 {v1.4s}, [x4], #16")
N("fcvtl v6.2d, v1.2s"); N("fcvtl2 v7.2d, v1.4s")
# v
N("fcvtl v10.2d, v2.2s"); N("fcvtl2 v11.2d, v2.4s")
for a, g in (("v10","v4"),("v11","v5")):
    N(f"fmul v8.2d, {g}.2d, {g}.2d"); N("fmul v8.2d, v8.2d, v19.2d"); N(f"fmul {a}.2d, {a}.2d, v18.2d"); N(f"fadd {a}.2d, {a}.2d, v8.2d")
N("fcvtn v2.2s, v10.2d"); N("fcvtn2 v2.4s, v11.2d")
N("st1 {v2.4s}, [x5], #16")
N("fcvtl v10.2d, v2.2s"); N("fcvtl2 v11.2d, v2.4s")
# p
N("fcvtl v12.2d, v3.2s"); N("fcvtl2 v13.2d, v3.4s")
for mm, vv, pp in (("v6","v10","v12"),("v7","v11","v13")):
    N(f"fmul {mm}.2d, {mm}.2d, v20.2d"); N(f"fmul {vv}.2d, {vv}.2d, v21.2d"); N(f"fsqrt {vv}.2d, {vv}.2d"); N(f"fadd {vv}.2d, {vv}.2d, v23.2d")
    N(f"fdiv {mm}.2d, {mm}.2d, {vv}.2d"); N(f"fmul v8.2d, {pp}.2d, v24.2d"); N(f"fadd {mm}.2d, {mm}.2d, v8.2d")
    N(f"fmul {mm}.2d, {mm}.2d, v22.2d"); N(f"fsub {pp}.2d, {pp}.2d, {mm}.2d")
N("fcvtn v3.2s, v12.2d"); N("fcvtn2 v3.4s, v13.2d")
N("st1 {v3.4s}, [x0], #16")
endloop("adamw_loop"); G("RET")

text("lnNormNEON", 112, "func lnNormNEON(x, gamma, beta, y []float32, mu, rs float64)")
G("MOVD x_base+0(FP), R0"); G("MOVD x_len+8(FP), R3"); G("MOVD gamma_base+24(FP), R4"); G("MOVD beta_base+48(FP), R5"); G("MOVD y_base+72(FP), R1")
G("FMOVD mu+96(FP), F16"); G("FMOVD rs+104(FP), F17"); N("dup v16.2d, v16.d[0]"); N("dup v17.2d, v17.d[0]")
G("LSR $2, R3, R3")
loop("lnnorm_loop")
N("ld1 {v0.4s}, [x0], #16"); N("ld1 {v1.4s}, [x4], #16"); N("ld1 {v2.4s}, [x5], #16")
N("fcvtl v4.2d, v0.2s"); N("fcvtl2 v5.2d, v0.4s"); N("fcvtl v6.2d, v1.2s"); N("fcvtl2 v7.2d, v1.4s"); N("fcvtl v8.2d, v2.2s"); N("fcvtl2 v9.2d, v2.4s")
for a, gg, bb in (("v4","v6","v8"),("v5","v7","v9")):
    N(f"fsub {a}.2d, {a}.2d, v16.2d"); N(f"fmul {a}.2d, {a}.2d, v17.2d"); N(f"fmul {a}.2d, {a}.2d, {gg}.2d"); N(f"fadd {a}.2d, {a}.2d, {bb}.2d")
N("fcvtn v0.2s, v4.2d"); N("fcvtn2 v0.4s, v5.2d")
N("st1 {v0.4s}, [x1], #16")
endloop("lnnorm_loop"); G("RET")

# encode
uniq = sorted(set(insns))
res = subprocess.run(["llvm-mc", "-triple=aarch64", "-mattr=+neon", "-show-encoding"], input="\n".join(uniq)+"\n", capture_output=True, text=True)
if res.returncode != 0:
    sys.stderr.write(res.stderr); sys.exit(1)
encs = re.findall(r"encoding: \[0x(..),0x(..),0x(..),0x(..)\]", res.stdout)
assert len(encs) == len(uniq), (len(encs), len(uniq))
enc = {u: "0x" + e[3]+e[2]+e[1]+e[0] for u, e in zip(uniq, encs)}
hdr = """// Code generated by gen_elementwise_arm64.py; DO NOT EDIT.

//go:build !purego

#include "textflag.h"

// NEON cores of elementwise.go, the same operations in the same order as
// the Go reference and the AVX2 cores (no fused multiply-add), so every
// path gives the same bits. Go's assembler lacks most NEON floating-point
// instructions, so they are written as WORDs with the instruction in the
// comment. Lengths are multiples of 16 (the Go wrappers do the tail).
//
// Constants (exp32's and GELU's), loaded one per register with ld1r:
"""
for i,(n,_) in enumerate(consts): hdr += f"//   {R[n]} = {n}\n"
hdr += "\n"
for i,(n,v) in enumerate(consts): hdr += f"DATA elemc<>+{4*i}(SB)/4, ${v:#010x}\n"
hdr += f"GLOBL elemc<>(SB), RODATA|NOPTR, ${4*len(consts)}\n"
lines = [hdr]
for k, s in out:
    if k == "G":
        if s.endswith(":") or s.startswith("TEXT") or s.startswith("//") or s == "":
            lines.append(s)
        else:
            lines.append("\t" + s)
    else:
        lines.append(f"\tWORD ${enc[s]} // {s}")
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
