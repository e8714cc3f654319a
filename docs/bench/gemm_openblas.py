#!/usr/bin/python3
# What: float32 C = A·B in GFLOP/s (2·m·n·k flops per product) through numpy
#   and OpenBLAS, for the four shapes m×n×k that BenchmarkGemm in model/kernel
#   measures (512×512×512, 1024×128×512, 64×784×128, 16×128×784), on one
#   thread and on all threads, with OpenBLAS's Haswell kernel (AVX2+FMA) and
#   its SkylakeX kernel (AVX-512). The OpenBLAS side of docs/BENCHMARKS.md's
#   GEMM table, to set beside
#     go test -run '^$' -bench BenchmarkGemm ./model/kernel/
#   run on the same machine in the same session.
# Needs: Linux, Debian's python3-numpy and libopenblas0-pthread (a
#   DYNAMIC_ARCH OpenBLAS, so that OPENBLAS_CORETYPE picks the kernel); run it
#   with /usr/bin/python3 where another python3 comes first on PATH. It checks
#   that numpy really calls OpenBLAS and that OpenBLAS runs the kernel and
#   thread count asked for (openblas_get_corename, openblas_get_num_threads).
#   A kernel the CPU cannot run (no AVX-512) is reported, not measured.
# Run: /usr/bin/python3 docs/bench/gemm_openblas.py [--repeats 5] [--min-time 0.5]
#   Prints a markdown table: the median of --repeats timings per cell and the
#   range; each timing runs the product as often as fits in --min-time seconds
#   after a warm-up. OpenBLAS reads its kernel and thread count when it loads,
#   so the script runs itself once per (kernel, threads) in a child process.
#   Quick check that it works: --repeats 1 --min-time 0.05.

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import openblas  # noqa: E402

SHAPES = [(512, 512, 512), (1024, 128, 512), (64, 784, 128), (16, 128, 784)]


def measure(repeats, min_time):
    import numpy as np

    rng = np.random.default_rng(1)
    res = {}
    for m, n, k in SHAPES:
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        c = np.empty((m, n), dtype=np.float32)
        for _ in range(3):
            np.matmul(a, b, out=c)
        # Calibrate the iterations of one timing to about min_time.
        iters, t = 1, 0.0
        while True:
            t0 = time.perf_counter()
            for _ in range(iters):
                np.matmul(a, b, out=c)
            t = time.perf_counter() - t0
            if t >= min_time / 4 or iters >= 1 << 24:
                break
            iters *= 2
        iters = max(1, int(iters * min_time / max(t, 1e-9)))
        rates = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(iters):
                np.matmul(a, b, out=c)
            t = time.perf_counter() - t0
            rates.append(2.0 * m * n * k * iters / t / 1e9)
        res["%dx%dx%d" % (m, n, k)] = rates
    return res


def main():
    ap = argparse.ArgumentParser(description="float32 GEMM GFLOP/s of numpy+OpenBLAS, Haswell and SkylakeX kernels")
    ap.add_argument("--repeats", type=int, default=5, help="timings per cell; the table shows their median and range")
    ap.add_argument("--min-time", type=float, default=0.5, help="seconds each timing runs at least")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="the 'all threads' count (default: os.cpu_count())")
    ap.add_argument("--child", nargs=2, metavar=("CORETYPE", "THREADS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.repeats < 1 or args.min_time <= 0 or args.threads < 1:
        sys.exit("--repeats and --threads must be at least 1 and --min-time positive")

    if args.child:
        core, threads = args.child[0], int(args.child[1])
        path, config, _, _ = openblas.check_kernel(core, threads)
        print(json.dumps({"lib": path, "config": config, "rates": measure(args.repeats, args.min_time)}))
        return

    threads_list = [1] if args.threads == 1 else [1, args.threads]
    runs = openblas.child_runs(os.path.abspath(__file__),
                               ["--repeats", str(args.repeats), "--min-time", str(args.min_time)], threads_list)
    # The config string ends with the kernel's name; the columns name it.
    lib = next((r["lib"] + " (" + " ".join(r["config"].split()[:2]) + ")" for _, _, r, _ in runs if r), "not loaded")
    print("float32 C = A·B through numpy %s; %s; %s, %d CPUs; median of %d timings of >= %g s each (range)\n" % (
        __import__("numpy").__version__, lib, openblas.cpu_model(), os.cpu_count(), args.repeats, args.min_time))
    cols = [(core, t, r, note) for core, t, r, note in runs]
    print("| shape m×n×k | " + " | ".join("%s, %d thread%s" % (c, t, "" if t == 1 else "s") for c, t, _, _ in cols) + " |")
    print("|---|" + "---|" * len(cols))
    for m, n, k in SHAPES:
        key = "%dx%dx%d" % (m, n, k)
        cells = []
        for _, _, r, note in cols:
            if r is None:
                cells.append("— (%s)" % note)
                continue
            v = r["rates"][key]
            cells.append("%.1f GFLOP/s (%.1f–%.1f)" % (statistics.median(v), min(v), max(v)))
        print("| %d×%d×%d | %s |" % (m, n, k, " | ".join(cells)))


if __name__ == "__main__":
    main()
