#!/usr/bin/python3
# What: seconds per epoch of the MLP epoch that BenchmarkEpoch in
#   wasm/bench_test.go runs natively (model/train.Train) and through the WASM
#   module, done in numpy + OpenBLAS instead: 784-128-10, ReLU, softmax
#   cross-entropy, the first 6,000 MNIST training images, batch 32, plain SGD
#   at learning rate 0.1, one epoch. It starts from the same initial weights
#   (train.InitMLP's seeded uniform init, reproduced bit for bit) and visits
#   the examples in the same order (sgd.Order, seed 1), so each step does the
#   same products on the same shapes; the epoch's mean loss and accuracy are
#   printed to check it against Go's (they agree to rounding, not bit for bit:
#   the summation order differs). Per (kernel, threads): OpenBLAS's Haswell
#   kernel (AVX2+FMA) and its SkylakeX kernel (AVX-512), one thread by default.
#   Set the figures beside
#     go test -run '^$' -bench BenchmarkEpoch -count 5 ./wasm/
#   run on the same machine in the same session.
# Needs: Linux, Debian's python3-numpy and libopenblas0-pthread (/usr/bin/python3
#   where another python3 comes first on PATH), and the MNIST files the Go code
#   reads: the copy in this repository (data/embedded/mnist/*.gz, found from the
#   script's own place), or the directory FLEETLEARN_MNIST_DIR or --mnist-dir names.
#   --dataset DIR reads a device dataset instead (docs/DATASET.md), e.g.
#   DIR/device-0 from `fleetlearn data mnist --devices 100 --alpha 0.5 --seed 1
#   --out DIR`, all of its examples (use --lr 0.05 for Fleetlearn's default
#   local training there).
# Run: /usr/bin/python3 docs/bench/epoch_numpy.py [--runs 10] [--threads 1,2]
#   Prints a markdown table: median seconds per epoch over --runs epochs after
#   one warm-up epoch, with the range. Quick check: --runs 1.

import argparse
import gzip
import json
import os
import statistics
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import openblas  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def init_mlp(sizes, seed):
    """train.InitMLP: for each layer, weights out×in drawn row-major from one
    SplitMix64 stream as float32((2u - 1)·sqrt(6/in)), biases zero."""
    import numpy as np

    state, layers = seed, []
    for fan_in, fan_out in zip(sizes, sizes[1:]):
        bound = (6.0 / fan_in) ** 0.5
        w = np.empty(fan_in * fan_out, dtype=np.float32)
        for j in range(w.size):
            state = (state + GOLDEN) & M64
            u = (mix(state) >> 11) / float(1 << 53)
            w[j] = (2 * u - 1) * bound
        layers.append((w.reshape(fan_out, fan_in), np.zeros(fan_out, dtype=np.float32)))
    return layers


def order(n, seed, epoch):
    """sgd.Order: a Fisher–Yates shuffle of 0..n-1 driven by SplitMix64 with
    rejection sampling, so that the batches are Go's batches."""
    idx = list(range(n))
    state = (seed ^ ((epoch + 1) * GOLDEN)) & M64
    for i in range(n - 1, 0, -1):
        bound = i + 1
        limit = ((1 << 64) - bound) % bound
        while True:
            state = (state + GOLDEN) & M64
            v = mix(state)
            if v >= limit:
                break
        j = v % bound
        idx[i], idx[j] = idx[j], idx[i]
    return idx


def read_idx(path, magic):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    got, = struct.unpack(">I", raw[:4])
    if got != magic:
        sys.exit("%s: IDX magic %#x, want %#x: not the MNIST file it should be" % (path, got, magic))
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    return dims, raw[4 + 4 * ndim:]


def load_mnist(d, n):
    import numpy as np

    dims, pix = read_idx(os.path.join(d, "train-images-idx3-ubyte.gz"), 0x803)
    ldims, lab = read_idx(os.path.join(d, "train-labels-idx1-ubyte.gz"), 0x801)
    if dims[1:] != (28, 28) or dims[0] != ldims[0] or n > dims[0]:
        sys.exit("%s: images %s, labels %s: want 28×28 images, as many labels, at least %d" % (d, dims, ldims, n))
    # data.LoadMNIST: float32(pixel) / 255.
    x = np.frombuffer(pix, dtype=np.uint8, count=n * 784).astype(np.float32).reshape(n, 784) / np.float32(255)
    y = np.frombuffer(lab, dtype=np.uint8, count=n).astype(np.int64)
    return x, y, 10


def load_dataset(d):
    """A fleetlearn-dataset/v1 directory (docs/DATASET.md)."""
    import numpy as np

    with open(os.path.join(d, "manifest.json")) as f:
        man = json.load(f)
    if man.get("format") != "fleetlearn-dataset/v1":
        sys.exit("%s: format %r, want fleetlearn-dataset/v1" % (d, man.get("format")))
    n, dim, classes = man["num_examples"], man["dim"], man["num_classes"]
    x = np.fromfile(os.path.join(d, man["features"]), dtype="<f4").reshape(n, dim)
    y = np.fromfile(os.path.join(d, man["labels"]), dtype=np.uint8).astype(np.int64)
    if y.size != n:
        sys.exit("%s: %d labels for %d examples" % (d, y.size, n))
    return np.ascontiguousarray(x, dtype=np.float32), y, classes


def epoch(layers, x, y, batches, lr):
    """One epoch of model/train's step, in place on layers: forward (x·Wᵀ + b,
    ReLU between layers), softmax cross-entropy whose log-sum-exp is taken in
    float64 as kernel.SoftmaxXent does, backward, SGD update. Returns the
    epoch's mean loss and accuracy, measured on each batch before its update."""
    import numpy as np

    (w1, b1), (w2, b2) = layers
    lr32 = np.float32(lr)
    loss_sum, correct = 0.0, 0
    for bidx in batches:
        xb, yb = x[bidx], y[bidx]
        rows = len(bidx)
        h = xb @ w1.T
        h += b1
        np.maximum(h, 0, out=h)
        logits = h @ w2.T
        logits += b2
        z = logits.astype(np.float64)
        z -= z.max(axis=1, keepdims=True)
        lse = np.log(np.exp(z).sum(axis=1, keepdims=True))
        r = np.arange(rows)
        loss = float((lse[:, 0] - z[r, yb]).mean())
        correct += int((logits.argmax(axis=1) == yb).sum())
        g = np.exp(z - lse).astype(np.float32)
        g[r, yb] -= 1
        g *= np.float32(1) / np.float32(rows)
        dw2 = g.T @ h
        db2 = g.sum(axis=0)
        gh = g @ w2
        gh *= h > 0
        dw1 = gh.T @ xb
        db1 = gh.sum(axis=0)
        w2 -= lr32 * dw2
        b2 -= lr32 * db2
        w1 -= lr32 * dw1
        b1 -= lr32 * db1
        loss_sum += loss * rows
    return loss_sum / len(y), correct / len(y)


def measure(args):
    import numpy as np

    if args.dataset:
        x, y, classes = load_dataset(args.dataset)
        src = "%s (%d examples)" % (args.dataset, len(y))
    else:
        d = args.mnist_dir or os.environ.get("FLEETLEARN_MNIST_DIR") or os.path.join(REPO, "data", "embedded", "mnist")
        x, y, classes = load_mnist(d, args.examples)
        src = "the first %d MNIST training images (%s)" % (args.examples, d)
    if x.shape[1] != 784 or classes != 10:
        sys.exit("dataset has dim %d and %d classes; the benchmark's MLP is 784-128-10" % (x.shape[1], classes))
    init = init_mlp([784, 128, 10], 1)
    idx = np.array(order(len(y), 1, 0), dtype=np.int64)
    batches = [idx[i:i + args.batch] for i in range(0, len(idx), args.batch)]
    times, metrics = [], None
    for i in range(args.runs + 1):
        layers = [(w.copy(), b.copy()) for w, b in init]  # Train clones the model too
        t0 = time.perf_counter()
        m = epoch(layers, x, y, batches, args.lr)
        t = time.perf_counter() - t0
        metrics = metrics or m
        if i > 0:  # the first is the warm-up
            times.append(t)
    return {"source": src, "times": times, "loss": metrics[0], "accuracy": metrics[1]}


def main():
    ap = argparse.ArgumentParser(description="numpy+OpenBLAS seconds per epoch of BenchmarkEpoch's MLP epoch")
    ap.add_argument("--runs", type=int, default=10, help="timed epochs per kernel (after one warm-up)")
    ap.add_argument("--threads", default="1", help="comma-separated OpenBLAS thread counts to measure (default 1)")
    ap.add_argument("--examples", type=int, default=6000, help="first MNIST training images to use (BenchmarkEpoch: 6000)")
    ap.add_argument("--batch", type=int, default=32, help="batch size (BenchmarkEpoch: 32)")
    ap.add_argument("--lr", type=float, default=0.1, help="SGD learning rate (BenchmarkEpoch: 0.1; Fleetlearn's default task: 0.05)")
    ap.add_argument("--mnist-dir", help="directory of the gzipped MNIST IDX files (default: FLEETLEARN_MNIST_DIR, else the repository's copy)")
    ap.add_argument("--dataset", help="a device dataset directory (docs/DATASET.md) to train on instead, all its examples")
    ap.add_argument("--child", nargs=2, metavar=("CORETYPE", "THREADS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    try:
        threads_list = [int(t) for t in args.threads.split(",")]
    except ValueError:
        sys.exit("--threads %r: want comma-separated integers such as 1,2" % args.threads)
    if args.runs < 1 or args.examples < 1 or args.batch < 1 or args.lr <= 0 or min(threads_list) < 1:
        sys.exit("--runs, --examples, --batch and --threads must be at least 1 and --lr positive")

    if args.child:
        core, threads = args.child[0], int(args.child[1])
        openblas.check_kernel(core, threads)
        print(json.dumps(measure(args)))
        return

    extra = ["--runs", str(args.runs), "--examples", str(args.examples), "--batch", str(args.batch), "--lr", repr(args.lr)]
    if args.mnist_dir:
        extra += ["--mnist-dir", args.mnist_dir]
    if args.dataset:
        extra += ["--dataset", args.dataset]
    runs = openblas.child_runs(os.path.abspath(__file__), extra, threads_list)
    first = next((r for _, _, r, _ in runs if r), None)
    print("MLP 784-128-10 epoch, batch %d, SGD lr %g, on %s; numpy %s with OpenBLAS; %s, %d CPUs; "
          "median of %d epochs after one warm-up (range)\n" % (
              args.batch, args.lr, first["source"] if first else "-", __import__("numpy").__version__,
              openblas.cpu_model(), os.cpu_count(), args.runs))
    print("| OpenBLAS kernel | threads | s/epoch | epoch loss | epoch accuracy |")
    print("|---|---|---|---|---|")
    for core, threads, r, note in runs:
        if r is None:
            print("| %s | %d | — (%s) | | |" % (core, threads, note))
            continue
        t = r["times"]
        print("| %s | %d | %.4f (%.4f–%.4f) | %.6f | %.4f |" % (
            core, threads, statistics.median(t), min(t), max(t), r["loss"], r["accuracy"]))


if __name__ == "__main__":
    main()
