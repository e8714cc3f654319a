#!/usr/bin/python3
# What: the measuring half of lm-fleet.sh (run that, not this), in two steps.
#   `run` creates the task, follows it with `fleetlearn task watch` to its
#   end, and at every round's close reads the CPU time of the server and of
#   every agent from /proc/PID/stat; at the end it reads the server's and the
#   agents' peak RSS (VmHWM in /proc/PID/status) and the server's own round
#   records (`fleetlearn task rounds -o json`), and writes the figures.
#   `spans`, once the processes have stopped (they flush their spans when
#   they exit), reads the OpenTelemetry span files of the server and the
#   agents (--trace-file) and adds, per round, when the last device's upload
#   ended and how long the server took from then to the round's close,
#   with its aggregation and commit spans.
# Needs: Linux (/proc), Python 3.8+ (standard library only), fleet_monitor.py
#   beside it (its /proc and timestamp readers).
# Run: round_monitor.py run --cli BIN/fleetlearn --pids FILE --out FILE.json
#        -- fleetlearn task create ... -o json
#      round_monitor.py spans --json FILE.json SERVER.trace EDGE.trace ...
#   FILE lists "name pid" per line, the server first ("server PID"), then the
#   agents ("edge-K PID").
#
# How the figures are taken:
# - a round's wall time is the time between the server's close times of
#   consecutive rounds (close_time in the round records), round 1's from
#   just before the task is created: what a round costs end to end, the
#   opening of the next one included. open_to_close is the record's own
#   span, from the round's opening to its commit.
# - CPU (utime + stime, kernel-accounted, in ticks of 1/SC_CLK_TCK s) is
#   sampled when `task watch` prints a round's close, so a round's CPU is
#   the difference between two samples; the server's share of a round is its
#   CPU-seconds over the wall time between the same two samples.
# - the tail is the round span's end (the server's close, after the commit)
#   minus the end of the last `upload` span of the round's trace: how long
#   the round waited on the server once every report was stored.

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone

# Importing fleet_monitor would otherwise leave a __pycache__ in the checkout.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fleet_monitor import TICK, cpu_seconds, sample, ts  # noqa: E402


def vm_hwm_mib(pid):
    """Peak resident set size of a live process (VmHWM), in MiB; None if gone."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def read_pids(path):
    procs = []
    with open(path) as f:
        for line in f:
            name, pid = line.split()
            procs.append((name, int(pid)))
    if not procs or procs[0][0] != "server":
        sys.exit("%s: want the server's line first" % path)
    return procs


def run(args):
    create = args.create[1:] if args.create[:1] == ["--"] else args.create
    procs = read_pids(args.pids)
    edges = [n for n, _ in procs if n != "server"]

    samples = [(time.time(), sample(procs))]
    t_create = samples[0][0]
    res = subprocess.run(create, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit("task create failed:\n" + res.stderr)
    sys.stderr.write(res.stderr)
    task = json.loads(res.stdout)["id"]

    watch = subprocess.Popen([args.cli, "task", "watch", task], stdout=subprocess.PIPE, text=True)
    line_re = re.compile(r"^round (\d+) train \S+ (committed|abandoned) ")
    closes = {}
    for line in watch.stdout:
        m = line_re.match(line)
        if not m:
            continue
        now = time.time()
        cpu = sample(procs)
        rnd, what = int(m.group(1)), m.group(2)
        closes[rnd] = (now, cpu, what)
        samples.append((now, cpu))
        print("%7.1f s  round %d %s  server %.1f CPU-s so far" % (
            now - t_create, rnd, what, cpu["server"] - samples[0][1]["server"]), flush=True)
    if watch.wait() != 0:
        sys.exit("task watch ended with an error (status %d): see server.log in the work directory" % watch.returncode)
    hwm = {name: vm_hwm_mib(pid) for name, pid in procs}

    res = subprocess.run([args.cli, "task", "rounds", task, "-o", "json"], capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit("task rounds failed:\n" + res.stderr)
    rounds = sorted(json.loads(res.stdout).get("rounds", []), key=lambda r: int(r["round"]))
    if not rounds:
        sys.exit("the task ran no round: see server.log in the work directory")

    per_round = []
    prev_close, prev_sample = t_create, samples[0]
    for r in rounds:
        n = int(r["round"])
        if "close_time" not in r or n not in closes:
            continue
        close = ts(r["close_time"])
        now, cpu, what = closes[n]
        dt = now - prev_sample[0]
        srv = cpu["server"] - prev_sample[1]["server"]
        per_round.append({
            "round": n,
            "state": r.get("state"),
            "reported": r.get("reported"),
            "wall_s": close - prev_close,
            "open_to_close_s": close - ts(r["open_time"]),
            "sampled_wall_s": dt,
            "server_cpu_s": srv,
            "edges_cpu_s": sum(cpu[e] - prev_sample[1][e] for e in edges),
            "server_share": srv / dt if dt > 0 else None,
            "open_time": ts(r["open_time"]),
            "close_time": close,
        })
        prev_close, prev_sample = close, (now, cpu)

    committed = [p for p in per_round if p["state"] == "ROUND_STATE_COMMITTED"]
    steady = committed[1:] or committed
    end_cpu = samples[-1][1]
    out = {
        "task": task,
        "rounds": len(per_round),
        "committed_rounds": len(committed),
        "abandoned_rounds": sum(1 for p in per_round if p["state"] == "ROUND_STATE_ABANDONED"),
        "task_created": t_create,
        "per_round": per_round,
        "median_s_per_round": median([p["wall_s"] for p in committed]),
        "median_s_per_round_after_first": median([p["wall_s"] for p in steady]),
        "server_cpu_s_total": end_cpu["server"] - samples[0][1]["server"],
        "server_cpu_s_per_round_median": median([p["server_cpu_s"] for p in committed]),
        "server_cpu_s_per_round_after_first_median": median([p["server_cpu_s"] for p in steady]),
        "server_share_median": median([p["server_share"] for p in committed]),
        "edges_cpu_s_total": sum(end_cpu[e] - samples[0][1][e] for e in edges),
        "server_vmhwm_mib": hwm["server"],
        "edge_vmhwm_mib": {e: hwm[e] for e in edges},
        "clock_tick_s": 1 / TICK,
    }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2)
    if not committed:
        sys.exit("no round committed: see server.log and the agents' logs in the work directory")


_frac = re.compile(r"^(.*T\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$")


def span_time(s):
    """An RFC 3339 time with up to nanoseconds and any offset, in seconds."""
    m = _frac.match(s)
    if not m:
        raise ValueError("not an RFC 3339 time: %r" % s)
    off = "+00:00" if m.group(3) == "Z" else m.group(3)
    return datetime.fromisoformat(m.group(1) + off).timestamp() + (float("0" + m.group(2)) if m.group(2) else 0.0)


def read_spans(path):
    """The spans of one --trace-file (JSON objects one after another)."""
    dec = json.JSONDecoder()
    with open(path) as f:
        text = f.read()
    spans, i = [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return spans
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            # A process killed before its exporter finished leaves a cut line.
            return spans
        spans.append(obj)


def attr(span, key):
    for a in span.get("Attributes") or []:
        if a.get("Key") == key:
            return a.get("Value", {}).get("Value")
    return None


def spans(args):
    with open(args.json) as f:
        out = json.load(f)
    by_trace = {}
    for path in args.traces:
        if not os.path.exists(path):
            continue
        for s in read_spans(path):
            by_trace.setdefault(s["SpanContext"]["TraceID"], []).append(s)
    rounds = {}
    for tr in by_trace.values():
        root = [s for s in tr if s["Name"] == "round" and attr(s, "fleetlearn.task.id") == out["task"]]
        if not root:
            continue
        n = int(attr(root[0], "fleetlearn.round"))
        end = span_time(root[0]["EndTime"])

        def ends(name):
            return [span_time(s["EndTime"]) for s in tr if s["Name"] == name]

        def total(name):
            return sum(span_time(s["EndTime"]) - span_time(s["StartTime"]) for s in tr if s["Name"] == name)

        uploads, validations = ends("upload"), ends("validation")
        sizes = [attr(s, "fleetlearn.report.bytes") for s in tr if s["Name"] == "upload"]
        sizes = [int(b) for b in sizes if b is not None]
        trainings = ends("training")
        rounds[n] = {
            "uploads": len(uploads),
            "report_bytes_max": max(sizes) if sizes else None,
            "last_training_end": max(trainings) if trainings else None,
            "last_upload_end": max(uploads) if uploads else None,
            "last_validation_end": max(validations) if validations else None,
            "tail_s": end - max(uploads) if uploads else None,
            "validation_s_total": total("validation"),
            "upload_s_total": total("upload"),
            "aggregation_s": total("aggregation"),
            "commit_s": total("commit"),
        }
    for p in out["per_round"]:
        if p["round"] in rounds:
            p["spans"] = rounds[p["round"]]
    tails = [p["spans"]["tail_s"] for p in out["per_round"] if "spans" in p and p["state"] == "ROUND_STATE_COMMITTED"]
    out["tail_s_median"] = median(tails)
    sizes = [p["spans"]["report_bytes_max"] for p in out["per_round"] if p.get("spans", {}).get("report_bytes_max")]
    out["report_bytes_max"] = max(sizes) if sizes else None
    with open(args.json, "w") as f:
        json.dump(out, f, indent=2)
    table(out)


def fmt(x, f="%.1f"):
    return "-" if x is None else f % x


def table(out):
    print()
    print("| round | state | wall s (close to close) | open to close s | server CPU-s | server share | agents CPU-s"
          " | last upload to close s | server validation s (sum) | aggregation s | commit s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for p in out["per_round"]:
        sp = p.get("spans", {})
        print("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            p["round"], p["state"].replace("ROUND_STATE_", "").lower(), fmt(p["wall_s"]), fmt(p["open_to_close_s"]),
            fmt(p["server_cpu_s"]), fmt(p["server_share"], "%.3f"), fmt(p["edges_cpu_s"]), fmt(sp.get("tail_s"), "%.2f"),
            fmt(sp.get("validation_s_total"), "%.2f"), fmt(sp.get("aggregation_s"), "%.2f"), fmt(sp.get("commit_s"), "%.2f")))
    print()
    print("| figure | value |")
    print("|---|---|")
    print("| committed rounds (abandoned) | %d (%d) |" % (out["committed_rounds"], out["abandoned_rounds"]))
    print("| median s/round, all committed (from round 2) | %s (%s) |" % (
        fmt(out["median_s_per_round"]), fmt(out["median_s_per_round_after_first"])))
    print("| server CPU-s per round, median (from round 2) | %s (%s) |" % (
        fmt(out["server_cpu_s_per_round_median"], "%.2f"), fmt(out["server_cpu_s_per_round_after_first_median"], "%.2f")))
    print("| server share of the round (CPU-s / wall s), median | %s |" % fmt(out["server_share_median"], "%.3f"))
    print("| last upload to round close, median s | %s |" % fmt(out.get("tail_s_median"), "%.2f"))
    print("| largest report (upload span) | %s bytes |" % fmt(out.get("report_bytes_max"), "%d"))
    print("| server peak RSS (VmHWM) | %s MiB |" % fmt(out["server_vmhwm_mib"], "%.0f"))
    print("| agents' peak RSS (VmHWM) | %s MiB |" % ", ".join(fmt(v, "%.0f") for v in out["edge_vmhwm_mib"].values()))
    print("| CPU-s, server / all agents, whole task | %.1f / %.1f |" % (out["server_cpu_s_total"], out["edges_cpu_s_total"]))
    print("\nCPU time is read from /proc/PID/stat in ticks of %g s." % out["clock_tick_s"])


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--cli", required=True)
    r.add_argument("--pids", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("create", nargs=argparse.REMAINDER)
    s = sub.add_parser("spans")
    s.add_argument("--json", required=True)
    s.add_argument("traces", nargs="*")
    args = ap.parse_args()
    if args.cmd == "run":
        run(args)
    else:
        spans(args)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    main()
