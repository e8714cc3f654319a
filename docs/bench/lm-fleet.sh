#!/usr/bin/env bash
# What: README's "Fine-tuning a language model" on one machine, as real
#   processes, measured per round: one fleetlearn-server and three enrolled
#   fleetlearn-edge agents, each freshly enrolled with an empty state
#   directory and given one package of the Go source built into fleetlearn
#   (`data gosrc --embedded --window 32 --stride 32 --max-devices 3`), the
#   example lm module, a seeded transformer (default lm:d=512,layers=4,
#   context=32: 12,719,104 parameters, 50.9 MB float32 updates, sent in
#   chunks) fine-tuned whole (no --trainable, no LoRA) with the module's
#   default hyper-parameters (1 epoch, batch 16, AdamW lr 1e-3) but at most
#   40 steps per round: at this size a step is about 3.9e10 floating-point
#   operations, so the sandbox's kernel budget of 2e12 per call ends a
#   call at about 51 steps, and a whole epoch over the largest package
#   (archive/tar, 2,770 windows, 173 steps) would have the agents give the
#   round up ("kernel budget exceeded"). Cohort 3, report goal 3, no
#   over-selection, plain FedAvg, ROUNDS rounds. No server
#   evaluation set and no pool job: the server's work is the rounds' own
#   (plans, report intake, aggregation, commit).
#   It prints, per round: the wall time between round closes (round 1's from
#   the task's creation), the server's and the agents' CPU-seconds, the
#   server's share of the round (its CPU-seconds over the round's wall
#   time) and, from the processes' OpenTelemetry spans, the time from the
#   last device's upload to the round's close; then the medians and the
#   server's peak RSS (VmHWM). round_monitor.py beside this script says how
#   each figure is taken.
# Needs: Linux (/proc), bash, /usr/bin/python3 (standard library only),
#   fleet_monitor.py and round_monitor.py beside this script, about 3 GB of
#   memory and 2 GB of disk, and binaries built from the revision to
#   measure:
#     go build -o /tmp/after/ ./cmd/...
#   Run it on a quiet machine: every process shares its cores, and the
#   devices' training takes most of each round.
# Run: docs/bench/lm-fleet.sh BIN_DIR [WORK_DIR]
#   BIN_DIR holds fleetlearn, fleetlearn-server and fleetlearn-edge; WORK_DIR
#   (default: a new temporary directory, kept) receives the datasets, state
#   directories, logs, span files and lm.json with the figures. To compare
#   two builds, run it once per BIN_DIR, alternating. Environment knobs:
#   ROUNDS=3 ARCH=lm:d=512,layers=4,context=32 HYPER='{"max_steps": 40}'
#   (module hyper-parameters as JSON; empty: the module's defaults)
#   REPORT_TIMEOUT=10m CALL_TIMEOUT=10m (on a shared machine a device's
#   training and its upload can outlast the task defaults, 2 min and 5 min,
#   and the round would be abandoned) EDGE_FLAGS="--wasm-engine compiler"
#   (extra flags for every agent, split on spaces) PYTHON=/usr/bin/python3
#   CLEAN=1 (at the end, delete the state directories, datasets and models,
#   which hold GBs, keeping the logs, span files and lm.json).
#   A short check that it works: ROUNDS=2 ARCH=lm:d=64,layers=2,context=32 docs/bench/lm-fleet.sh BIN_DIR
set -euo pipefail

if [[ $# -lt 1 || $# -gt 2 ]]; then
  echo "usage: $0 BIN_DIR [WORK_DIR]   (BIN_DIR from: go build -o BIN_DIR/ ./cmd/...)" >&2
  exit 2
fi
BIN=$(cd "$1" && pwd)
for b in fleetlearn fleetlearn-server fleetlearn-edge; do
  [[ -x $BIN/$b ]] || { echo "$BIN/$b is missing: build it with go build -o $BIN/ ./cmd/..." >&2; exit 2; }
done
HERE=$(cd "$(dirname "$0")" && pwd)
for f in fleet_monitor.py round_monitor.py; do
  [[ -f $HERE/$f ]] || { echo "$HERE/$f is missing: run this script from a checkout of docs/bench" >&2; exit 2; }
done
ROUNDS=${ROUNDS:-3}
ARCH=${ARCH:-lm:d=512,layers=4,context=32}
HYPER=${HYPER-'{"max_steps": 40}'}
REPORT_TIMEOUT=${REPORT_TIMEOUT:-10m}
CALL_TIMEOUT=${CALL_TIMEOUT:-10m}
PYTHON=${PYTHON:-/usr/bin/python3}
[[ -x $PYTHON ]] || { echo "$PYTHON not found: install python3 or set PYTHON to it" >&2; exit 2; }
WORK=${2:-$(mktemp -d "${TMPDIR:-/tmp}/lm-fleet.XXXXXX")}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
if [[ -e $WORK/server || -e $WORK/edge ]]; then
  echo "$WORK already holds a fleet; give an empty WORK_DIR, since the job measures a fresh one" >&2
  exit 2
fi
echo "work directory: $WORK"
FL=$BIN/fleetlearn

PIDS=()
stop_all() {
  # Only the processes this script started, by their ids; SIGTERM lets them
  # flush their spans.
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PIDS=()
}
trap stop_all EXIT

# quiet runs a setup step with its output in setup.log, shown on failure.
quiet() {
  "$@" >>"$WORK/setup.log" 2>&1 || { echo "failed: $*" >&2; tail -20 "$WORK/setup.log" >&2; exit 1; }
}

free_port() { "$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
NATS=127.0.0.1:$(free_port)
GRPC=127.0.0.1:$(free_port)

# Data: three devices, one Go package each.
quiet "$FL" data gosrc --embedded --out "$WORK/gosrc" --window 32 --stride 32 --max-devices 3
DEVS=("$WORK"/gosrc/devices/*)
[[ ${#DEVS[@]} -eq 3 ]] || { echo "data gosrc wrote ${#DEVS[@]} device datasets, not 3: see $WORK/setup.log" >&2; exit 1; }

# The server, trusting one module publisher key.
"$FL" module keygen "$WORK/publisher.pem" >"$WORK/publishers.jwks" 2>>"$WORK/setup.log"
"$BIN/fleetlearn-server" --data-dir "$WORK/server" --nats-listen "$NATS" --grpc-addr "$GRPC" \
  --metrics-addr off --log-level info --module-publishers "$WORK/publishers.jwks" \
  --trace-file "$WORK/server.trace" >"$WORK/server.log" 2>&1 &
SERVER=$!
PIDS+=("$SERVER")
export FLEETLEARN_SERVER=$GRPC FLEETLEARN_CA=$WORK/server/tls/ca.crt FLEETLEARN_TOKEN_FILE=$WORK/server/admin.token
for i in $(seq 600); do
  if [[ -f $FLEETLEARN_CA && -f $FLEETLEARN_TOKEN_FILE ]] && "$FL" task list >/dev/null 2>&1; then break; fi
  kill -0 "$SERVER" 2>/dev/null || { echo "the server exited:" >&2; tail -20 "$WORK/server.log" >&2; exit 1; }
  [[ $i -lt 600 ]] || { echo "the server did not answer within 60 s: see $WORK/server.log" >&2; exit 1; }
  sleep 0.1
done

# The module, the base model.
quiet "$FL" module example lm -o "$WORK/lm.wasm"
MODULE=$("$FL" module register "$WORK/lm.wasm" --name lm --signing-key "$WORK/publisher.pem" 2>>"$WORK/setup.log")
"$FL" model init --arch "$ARCH" -o "$WORK/base.safetensors" >"$WORK/init.txt" 2>&1 ||
  { echo "model init --arch $ARCH failed:" >&2; cat "$WORK/init.txt" >&2; exit 1; }
PARAMS=$(sed -n 's/.* \([0-9][0-9]*\) parameters.*/\1/p' "$WORK/init.txt" | head -1)
head -1 "$WORK/init.txt"
quiet "$FL" model import "$WORK/base.safetensors" --name gocode-init

# The fleet: each device enrolled with a single-use token into an empty
# state directory, then its agent started on its package.
: >"$WORK/pids"
echo "server $SERVER" >>"$WORK/pids"
for k in 0 1 2; do
  "$FL" device token --ttl 1h >"$WORK/token" 2>>"$WORK/setup.log"
  quiet "$BIN/fleetlearn-edge" enroll --api "$GRPC" --ca "$FLEETLEARN_CA" --token-file "$WORK/token" \
    --data-dir "$WORK/edge/$k"
  # shellcheck disable=SC2086 # EDGE_FLAGS is a list of flags
  "$BIN/fleetlearn-edge" --data-dir "$WORK/edge/$k" --dataset "${DEVS[$k]}" --log-level info \
    --trace-file "$WORK/edge/$k.trace" ${EDGE_FLAGS:-} >"$WORK/edge/$k.log" 2>&1 &
  PIDS+=("$!")
  echo "edge-$k $!" >>"$WORK/pids"
  echo "edge-$k: ${DEVS[$k]##*/}"
done
rm -f "$WORK/token"
for k in 0 1 2; do
  for i in $(seq 600); do
    grep -q "edge agent running" "$WORK/edge/$k.log" && break
    [[ $i -lt 600 ]] || { echo "agent $k did not start within 60 s: see $WORK/edge/$k.log" >&2; exit 1; }
    sleep 0.1
  done
done
echo "fleet up; creating the task ($ROUNDS rounds)"

HYPER_FLAGS=()
[[ -z $HYPER ]] || HYPER_FLAGS=(--hyper "$HYPER")
"$PYTHON" "$HERE/round_monitor.py" run --cli "$FL" --pids "$WORK/pids" --out "$WORK/lm.json" -- \
  "$FL" task create --name lm-fleet --model gocode-init --module "$MODULE" --cohort 3 --over-selection 1 \
  --report-goal 3 --rounds "$ROUNDS" --rule fedavg --report-timeout "$REPORT_TIMEOUT" \
  --call-timeout "$CALL_TIMEOUT" "${HYPER_FLAGS[@]}" -o json

# The spans are complete once the processes have flushed them at exit.
stop_all
"$PYTHON" - "$WORK/lm.json" "$BIN" "$ARCH" "$PARAMS" "$("$FL" version 2>&1 | head -1)" "$HYPER" <<'EOF'
import json, sys
path, bin_dir, arch, params, version, hyper = sys.argv[1:]
with open(path) as f:
    out = json.load(f)
out.update(bin_dir=bin_dir, arch=arch, parameters=int(params) if params else None, version=version,
           hyper=hyper or None)
with open(path, "w") as f:
    json.dump(out, f, indent=2)
EOF
"$PYTHON" "$HERE/round_monitor.py" spans --json "$WORK/lm.json" "$WORK/server.trace" "$WORK"/edge/*.trace
echo "model $ARCH: $PARAMS parameters; figures in $WORK/lm.json"
if [[ ${CLEAN:-0} == 1 ]]; then
  rm -rf "$WORK/server" "$WORK/gosrc" "$WORK/base.safetensors" "$WORK/lm.wasm" "$WORK/publisher.pem"
  for k in 0 1 2; do rm -rf "${WORK:?}/edge/$k"; done
fi
