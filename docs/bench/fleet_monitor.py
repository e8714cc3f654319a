#!/usr/bin/python3
# What: the measuring half of mnist-fleet.sh (run that, not this): it creates
#   the task, follows it with `fleetlearn task watch`, reads the CPU time of
#   the server and of every agent process from /proc/PID/stat, stops the task
#   once a committed round's server-side test accuracy reaches the target,
#   and prints the figures from the server's own round records
#   (`fleetlearn task rounds -o json`).
# Needs: Linux (/proc), Python 3.8+ (standard library only).
# Run: fleet_monitor.py --cli BIN/fleetlearn --pids FILE --cohort N --target A
#   --out FILE.json -- fleetlearn task create ... -o json
#   FILE lists "name pid" per line, the server first ("server PID"), then the
#   agents ("edge-K PID").
#
# How the CPU figures are taken (utime + stime, kernel-accounted, in clock
# ticks of 1/SC_CLK_TCK s, usually 10 ms):
# - all processes: summed over the server and every agent, from just before
#   the task is created to the event of the first round at the target; per
#   round is that divided by the committed training rounds up to it.
# - first selection: each agent's CPU from just before the task is created to
#   the COMMITTED event of the task's first committed round. With
#   over-selection 1 exactly --cohort agents take part in it, and on a fresh
#   fleet that is each one's first selection: check-in, model download,
#   module compilation, local training, update encoding, signature, upload.
#   The agents that did not take part only checked in; they are told apart
#   by their CPU (the --cohort largest are the selected ones) and their
#   median is printed as the baseline a selection is compared with.

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from datetime import datetime

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """utime + stime of a live process, in seconds; None once it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            s = f.read()
    except OSError:
        return None
    fields = s[s.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def sample(procs):
    out = {}
    for name, pid in procs:
        c = cpu_seconds(pid)
        if c is None:
            sys.exit("%s (pid %d) is no longer running: see its log in the work directory" % (name, pid))
        out[name] = c
    return out


def ts(s):
    """A protojson timestamp (RFC 3339, up to nanoseconds) in seconds."""
    s = s.rstrip("Z")
    frac = 0.0
    if "." in s:
        s, f = s.split(".")
        frac = float("0." + f)
    return datetime.fromisoformat(s + "+00:00").timestamp() + frac


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--pids", required=True)
    ap.add_argument("--cohort", type=int, required=True)
    ap.add_argument("--target", type=float, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("create", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    create = args.create[1:] if args.create[:1] == ["--"] else args.create
    procs = []
    with open(args.pids) as f:
        for line in f:
            name, pid = line.split()
            procs.append((name, int(pid)))
    if not procs or procs[0][0] != "server":
        sys.exit("%s: want the server's line first" % args.pids)
    edges = [p for p in procs if p[0] != "server"]

    base = sample(procs)
    res = subprocess.run(create, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit("task create failed:\n" + res.stderr)
    sys.stderr.write(res.stderr)
    task = json.loads(res.stdout)["id"]

    watch = subprocess.Popen([args.cli, "task", "watch", task], stdout=subprocess.PIPE, text=True)
    line_re = re.compile(r"^round (\d+) train \S+ (committed|abandoned) ")
    acc_re = re.compile(r"\bserver_accuracy=([0-9.eE+-]+)")
    first, at_target, stopped = None, None, False
    start = time.time()
    for line in watch.stdout:
        line = line.rstrip("\n")
        m = line_re.match(line)
        if not m:
            if line.startswith("base model"):
                print(line, flush=True)
            continue
        rnd, what = int(m.group(1)), m.group(2)
        a = acc_re.search(line)
        acc = float(a.group(1)) if a else None
        if rnd == 1 or rnd % 10 == 0 or (acc is not None and acc >= args.target):
            print("%6.1f s  round %d %s  server_accuracy=%s" % (time.time() - start, rnd, what, acc), flush=True)
        if what != "committed":
            continue
        if first is None:
            first = {"round": rnd, "cpu": sample(edges)}
        if acc is not None and acc >= args.target and at_target is None:
            at_target = {"round": rnd, "cpu": sample(procs)}
            subprocess.run([args.cli, "task", "stop", task, "--reason", "target accuracy reached"],
                           capture_output=True, text=True)
            stopped = True
    watch.wait()
    end = at_target or {"round": None, "cpu": sample(procs)}

    res = subprocess.run([args.cli, "task", "rounds", task, "-o", "json"], capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit("task rounds failed:\n" + res.stderr)
    rounds = sorted(json.loads(res.stdout).get("rounds", []), key=lambda r: int(r["round"]))
    if not rounds:
        sys.exit("the task ran no round: see server.log in the work directory")
    t0 = ts(rounds[0]["open_time"])
    committed, durations, hit = 0, [], None
    for r in rounds:
        if r.get("kind") != "ROUND_KIND_TRAIN" or r.get("state") != "ROUND_STATE_COMMITTED":
            continue
        committed += 1
        durations.append(ts(r["close_time"]) - ts(r["open_time"]))
        acc = r.get("metrics", {}).get("values", {}).get("server_accuracy")
        if acc is not None and acc >= args.target:
            hit = (r, committed, acc)
            break
    last = hit[0] if hit else [r for r in rounds if "close_time" in r][-1]
    n = hit[1] if hit else committed
    abandoned = sum(1 for r in rounds if r.get("state") == "ROUND_STATE_ABANDONED" and int(r["round"]) <= int(last["round"]))

    total = sum(end["cpu"][k] - base[k] for k in base)
    server = end["cpu"]["server"] - base["server"]
    out = {
        "task": task,
        "target": args.target,
        "reached": hit is not None,
        "rounds": n,
        "abandoned_rounds": abandoned,
        "last_round": int(last["round"]),
        "final_server_accuracy": hit[2] if hit else last.get("metrics", {}).get("values", {}).get("server_accuracy"),
        "seconds_to_target": ts(last["close_time"]) - t0,
        "median_s_per_round": statistics.median(durations) if durations else None,
        "mean_s_per_round": (ts(last["close_time"]) - t0) / n if n else None,
        "first_round_s": durations[0] if durations else None,
        "cpu_s_all": total,
        "cpu_s_server": server,
        "cpu_s_per_round": total / n if n else None,
        "cpu_s_server_per_round": server / n if n else None,
        "clock_tick_s": 1 / TICK,
    }
    if first:
        d = sorted((first["cpu"][k] - base[k] for k, _ in edges), reverse=True)
        sel, idle = d[:args.cohort], d[args.cohort:]
        first_row = next((r for r in rounds if int(r["round"]) == first["round"]), {})
        out["first_selection"] = {
            "round": first["round"],
            "assigned": first_row.get("assigned"),
            "reported": first_row.get("reported"),
            "cpu_s_median": statistics.median(sel),
            "cpu_s_min": min(sel),
            "cpu_s_max": max(sel),
            "not_selected_cpu_s_median": statistics.median(idle) if idle else None,
        }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2)

    print()
    print("| %s | value |" % ("target %g reached" % args.target if hit else "target %g NOT reached" % args.target))
    print("|---|---|")
    print("| rounds to the target (committed training rounds; abandoned: %d) | %d (last round number %d) |" % (
        abandoned, n, out["last_round"]))
    print("| server_accuracy of that round | %s |" % out["final_server_accuracy"])
    print("| time from round 1's start to that round's commit | %.1f s |" % out["seconds_to_target"])
    if durations:
        print("| median s/round (open to commit) | %.3f |" % out["median_s_per_round"])
        print("| mean s/round (time above / rounds) | %.3f |" % out["mean_s_per_round"])
        print("| round 1 (open to commit) | %.1f s |" % out["first_round_s"])
    print("| CPU-s per round, all processes (server) | %.3f (%.3f) |" % (out["cpu_s_per_round"], out["cpu_s_server_per_round"]))
    if first:
        fs = out["first_selection"]
        print("| first selection, CPU-s per agent: median (min–max) of the %d agents in round %d | %.2f (%.2f–%.2f); not selected: %s |" % (
            args.cohort, fs["round"], fs["cpu_s_median"], fs["cpu_s_min"], fs["cpu_s_max"],
            "%.2f" % fs["not_selected_cpu_s_median"] if fs["not_selected_cpu_s_median"] is not None else "-"))
        if fs["assigned"] != args.cohort:
            print("\nwarning: round %d assigned %s devices, not the cohort %d: the first-selection figure mixes "
                  "selected and unselected agents" % (fs["round"], fs["assigned"], args.cohort))
    print("\nCPU time is read from /proc/PID/stat in ticks of %g s. Figures: %s" % (1 / TICK, args.out))
    if not stopped and hit is None:
        sys.exit(2)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    main()
