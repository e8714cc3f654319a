"""Linear regression by minibatch SGD with momentum, in pure Python.

A stand-in for a torchrun script: it reads the torchrun environment, follows
the Fleetlearn checkpoint contract, and is bitwise deterministic across a
kill and resume, because parameters and momentum are kept in float32 and the
data order and RNG state are saved in state.json.

Test knobs (job environment):
  TRAIN_HANG_IN_CHECKPOINT=N  at step N, write half of step-N.tmp, print
                              "hanging step=N" and wait to be killed.
"""
import json
import os
import random
import shutil
import struct
import sys
import time

DIM = 8
N_SAMPLES = 64
BATCH = 4
LR = 0.05
MOMENTUM = 0.9


def f32(x):
    """Round a Python float to float32."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def dataset():
    """Deterministic synthetic data: y = w*.x + b* + noise."""
    rng = random.Random(1234)
    w_true = [f32(rng.uniform(-1, 1)) for _ in range(DIM)]
    b_true = f32(0.5)
    xs, ys = [], []
    for _ in range(N_SAMPLES):
        x = [f32(rng.uniform(-1, 1)) for _ in range(DIM)]
        y = f32(sum(a * b for a, b in zip(w_true, x)) + b_true + rng.gauss(0, 0.01))
        xs.append(x)
        ys.append(y)
    return xs, ys


def write_safetensors(path, tensors):
    """tensors: list of (name, shape, values) as F32, written by hand."""
    header, blobs, off = {}, [], 0
    for name, shape, vals in tensors:
        blob = struct.pack("<%df" % len(vals), *vals)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)  # align the buffer to 8 bytes, as safetensors does
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
        f.flush()
        os.fsync(f.fileno())


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            raise SystemExit("unsupported dtype %s" % info["dtype"])
        a, b = info["data_offsets"]
        out[name] = list(struct.unpack("<%df" % ((b - a) // 4), data[a:b]))
    return out


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def checkpoint(ckdir, step, w, b, vw, vb, state, hang_at):
    final = os.path.join(ckdir, "step-%d" % step)
    tmp = final + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)  # a previous run may have died here
    os.makedirs(tmp)
    if step == hang_at:
        with open(os.path.join(tmp, "model.safetensors"), "wb") as f:
            f.write(struct.pack("<Q", 4096) + b'{"linear.weight":')
        print("hanging step=%d" % step, flush=True)
        while True:
            time.sleep(3600)
    write_safetensors(os.path.join(tmp, "model.safetensors"),
                      [("linear.weight", [1, DIM], w), ("linear.bias", [1], [b])])
    write_safetensors(os.path.join(tmp, "optimizer.safetensors"),
                      [("momentum.linear.weight", [1, DIM], vw), ("momentum.linear.bias", [1], [vb])])
    write_json(os.path.join(tmp, "state.json"), state)
    fsync_dir(tmp)
    if os.path.isdir(final):
        shutil.rmtree(final)  # replacing a checkpoint the runner did not resume from
    os.rename(tmp, final)  # the commit point
    fsync_dir(ckdir)
    print("checkpoint step=%d path=%s" % (step, final), flush=True)


def main():
    env = os.environ
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
              "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT"):
        print("env %s=%s" % (k, env.get(k, "<unset>")), flush=True)
    ckdir = env["FLEETLEARN_CHECKPOINT_DIR"]
    steps = int(env["FLEETLEARN_STEPS"])
    every = int(env["FLEETLEARN_CHECKPOINT_EVERY"])
    hang_at = int(env.get("TRAIN_HANG_IN_CHECKPOINT", "-1"))
    xs, ys = dataset()

    resume = env.get("FLEETLEARN_RESUME_FROM")
    if resume:
        params = read_safetensors(os.path.join(resume, "model.safetensors"))
        moms = read_safetensors(os.path.join(resume, "optimizer.safetensors"))
        with open(os.path.join(resume, "state.json")) as f:
            st = json.load(f)
        w, b = params["linear.weight"], params["linear.bias"][0]
        vw, vb = moms["momentum.linear.weight"], moms["momentum.linear.bias"][0]
        step, epoch, cursor, perm = st["step"], st["epoch"], st["cursor"], st["perm"]
        rng = random.Random()
        v = st["rng"]
        rng.setstate((v[0], tuple(v[1]), v[2]))
        print("resumed step=%d from=%s" % (step, resume), flush=True)
    else:
        w, b = [0.0] * DIM, 0.0
        vw, vb = [0.0] * DIM, 0.0
        step, epoch, cursor = 0, 0, 0
        rng = random.Random(int(env.get("TRAIN_SEED", "7")))
        perm = list(range(N_SAMPLES))
        rng.shuffle(perm)

    while step < steps:
        gw, gb = [0.0] * DIM, 0.0
        for _ in range(BATCH):
            if cursor == N_SAMPLES:
                epoch, cursor = epoch + 1, 0
                perm = list(range(N_SAMPLES))
                rng.shuffle(perm)
            i = perm[cursor]
            cursor += 1
            x, y = xs[i], ys[i]
            err = f32(sum(a * c for a, c in zip(w, x)) + b - y)
            for j in range(DIM):
                gw[j] += err * x[j]
            gb += err
        vw = [f32(MOMENTUM * v + g / BATCH) for v, g in zip(vw, gw)]
        vb = f32(MOMENTUM * vb + gb / BATCH)
        w = [f32(p - LR * v) for p, v in zip(w, vw)]
        b = f32(b - LR * vb)
        step += 1
        if step % 10 == 0:
            loss = sum((sum(a * c for a, c in zip(w, x)) + b - y) ** 2 for x, y in zip(xs, ys)) / N_SAMPLES
            print("step=%d loss=%.6f" % (step, loss), flush=True)
        if step % every == 0 or step == steps:
            state = {"step": step, "epoch": epoch, "cursor": cursor, "perm": perm,
                     "rng": list(rng.getstate())}
            checkpoint(ckdir, step, w, b, vw, vb, state, hang_at)
    print("done step=%d" % step, flush=True)


if __name__ == "__main__":
    sys.exit(main())
