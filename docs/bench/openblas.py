# Shared by gemm_openblas.py and epoch_numpy.py: find the OpenBLAS that numpy
# loaded, say which kernel (core type) and how many threads it runs, and run a
# script again in child processes with OPENBLAS_CORETYPE and
# OPENBLAS_NUM_THREADS set, since OpenBLAS reads both once, when it loads.
#
# Not a benchmark itself: the two scripts import it from this directory.

import ctypes
import json
import os
import subprocess
import sys

# The kernels the figures compare, and the CPU flag each one needs: forcing a
# kernel the CPU cannot run would die of SIGILL instead of measuring anything.
CORETYPES = {"Haswell": "avx2", "SkylakeX": "avx512f"}


def cpu_flags():
    """The feature flags of the first CPU in /proc/cpuinfo (empty elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def loaded_openblas():
    """numpy's BLAS as loaded in this process: (path, config, corename,
    threads). Fails with what to do when numpy does not use OpenBLAS, since
    the figures would then describe another library."""
    import numpy  # noqa: F401  (loads the BLAS)

    paths = set()
    with open("/proc/self/maps") as f:
        for line in f:
            p = line.split()[-1]
            if "openblas" in os.path.basename(p).lower() and ".so" in p:
                paths.add(p)
    if not paths:
        sys.exit("numpy (%s) did not load OpenBLAS; run these scripts with Debian's python3-numpy and "
                 "libopenblas0-pthread (/usr/bin/python3), or a numpy wheel that bundles OpenBLAS" % numpy.__file__)
    path = sorted(paths)[0]
    lib = ctypes.CDLL(path)
    lib.openblas_get_config.restype = ctypes.c_char_p
    lib.openblas_get_corename.restype = ctypes.c_char_p
    lib.openblas_get_num_threads.restype = ctypes.c_int
    return (path, lib.openblas_get_config().decode(), lib.openblas_get_corename().decode(),
            lib.openblas_get_num_threads())


def check_kernel(want_core, want_threads):
    """Exit unless OpenBLAS runs the kernel and thread count asked for: an
    unknown OPENBLAS_CORETYPE silently falls back to the detected kernel."""
    path, config, core, threads = loaded_openblas()
    if core.lower() != want_core.lower():
        sys.exit("OpenBLAS (%s) runs the %s kernel, not %s: this OpenBLAS build lacks it or ignored "
                 "OPENBLAS_CORETYPE (a DYNAMIC_ARCH build such as Debian's is needed)" % (path, core, want_core))
    if threads != want_threads:
        sys.exit("OpenBLAS runs %d threads, not %d: unset OMP_NUM_THREADS/GOTO_NUM_THREADS" % (threads, want_threads))
    return path, config, core, threads


def child_runs(script, extra_args, threads_list):
    """Runs script once per (kernel, threads) in a fresh interpreter with the
    environment OpenBLAS reads at load; each child prints one JSON object as
    its last line. Returns [(core, threads, result or None, note)]."""
    flags = cpu_flags()
    out = []
    for core, flag in CORETYPES.items():
        for threads in threads_list:
            if flag not in flags:
                out.append((core, threads, None, "CPU lacks %s" % flag))
                continue
            env = dict(os.environ, OPENBLAS_CORETYPE=core, OPENBLAS_NUM_THREADS=str(threads))
            for v in ("OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_VERBOSE"):
                env.pop(v, None)
            p = subprocess.run([sys.executable, script, "--child", core, str(threads)] + extra_args,
                               env=env, capture_output=True, text=True)
            if p.returncode != 0:
                out.append((core, threads, None, (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]))
                continue
            out.append((core, threads, json.loads(p.stdout.strip().splitlines()[-1]), ""))
    return out
