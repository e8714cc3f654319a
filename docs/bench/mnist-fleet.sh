#!/usr/bin/env bash
# What: the end-to-end MNIST job on one machine, as real processes: MNIST
#   split over 100 devices (Dirichlet alpha 0.5, seed 1), one
#   fleetlearn-server and 100 fleetlearn-edge agents, each freshly enrolled
#   with an empty state directory (a fresh fleet: no agent has compiled the
#   module yet), the example MLP module and the seeded 784-128-10 base model,
#   the module's default local training (1 epoch, batch 32, SGD lr 0.05),
#   cohort 30 with --over-selection 1, plain FedAvg, every committed model
#   evaluated on the server's 10,000 test images; the task stops at the first
#   round whose test accuracy reaches 96% (or after MAX_ROUNDS rounds).
#   It prints: the time from round 1's start to the commit of the first round
#   at 96%, the median seconds per round, the CPU-seconds of all 101
#   processes per round, and one device's first-selection CPU cost (each
#   agent's CPU over the task's first round; the method is described in
#   fleet_monitor.py beside this script).
# Needs: Linux (/proc), bash, /usr/bin/python3 (standard library only), about
#   3 GB of memory and 3 GB of disk, and binaries built from the revision to
#   measure:
#     go build -o /tmp/after/ ./cmd/...
#   Run it on a quiet machine: every process shares its cores.
# Run: docs/bench/mnist-fleet.sh BIN_DIR [WORK_DIR]
#   BIN_DIR holds fleetlearn, fleetlearn-server and fleetlearn-edge; WORK_DIR
#   (default: a new temporary directory, kept) receives the datasets, state
#   directories, logs and fleet.json with the figures. To compare two builds,
#   run it once per BIN_DIR, alternating. Environment knobs (defaults are the
#   issue's job): DEVICES=100 COHORT=30 TARGET=0.96 MAX_ROUNDS=1000
#   DATASETS=DIR (reuse datasets written by an earlier run) PYTHON=/usr/bin/python3
#   EDGE_FLAGS="--wasm-engine compiler" (extra flags for every agent, split on spaces).
#   Exit status 0 when the target was reached, 2 when the task ran MAX_ROUNDS
#   rounds without reaching it (the figures then describe those rounds).
#   A short check that it works: DEVICES=10 COHORT=3 MAX_ROUNDS=3 docs/bench/mnist-fleet.sh BIN_DIR
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
DEVICES=${DEVICES:-100}
COHORT=${COHORT:-30}
TARGET=${TARGET:-0.96}
MAX_ROUNDS=${MAX_ROUNDS:-1000}
PYTHON=${PYTHON:-/usr/bin/python3}
WORK=${2:-$(mktemp -d "${TMPDIR:-/tmp}/mnist-fleet.XXXXXX")}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
if [[ -e $WORK/server || -e $WORK/edge ]]; then
  echo "$WORK already holds a fleet; give an empty WORK_DIR, since the job measures a fresh one" >&2
  exit 2
fi
echo "work directory: $WORK"
FL=$BIN/fleetlearn

PIDS=()
cleanup() {
  # Only the processes this script started, by their ids.
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

# quiet runs a setup step with its output in setup.log, shown on failure.
quiet() {
  "$@" >>"$WORK/setup.log" 2>&1 || { echo "failed: $*" >&2; tail -20 "$WORK/setup.log" >&2; exit 1; }
}

free_port() { "$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
NATS=127.0.0.1:$(free_port)
GRPC=127.0.0.1:$(free_port)

# Data: the same split as the issue's figures.
DS=${DATASETS:-$WORK/datasets}
if [[ ! -f $DS/eval/manifest.json || ! -f $DS/device-$((DEVICES - 1))/manifest.json ]]; then
  quiet "$FL" data mnist --devices "$DEVICES" --alpha 0.5 --seed 1 --out "$DS"
fi

# The server, trusting one module publisher key.
"$FL" module keygen "$WORK/publisher.pem" >"$WORK/publishers.jwks" 2>>"$WORK/setup.log"
"$BIN/fleetlearn-server" --data-dir "$WORK/server" --nats-listen "$NATS" --grpc-addr "$GRPC" \
  --metrics-addr off --log-level warn --module-publishers "$WORK/publishers.jwks" >"$WORK/server.log" 2>&1 &
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
quiet "$FL" module example mlp -o "$WORK/mlp.wasm"
MODULE=$("$FL" module register "$WORK/mlp.wasm" --name mlp --signing-key "$WORK/publisher.pem" 2>>"$WORK/setup.log")
quiet "$FL" model init --arch mlp:784,128,10 --seed 1 -o "$WORK/base.safetensors"
quiet "$FL" model import "$WORK/base.safetensors" --name mnist

# The fleet: each device enrolled with a single-use token into an empty
# state directory, then its agent started.
: >"$WORK/pids"
echo "server $SERVER" >>"$WORK/pids"
echo "enrolling and starting $DEVICES agents"
for ((k = 0; k < DEVICES; k++)); do
  "$FL" device token --ttl 1h >"$WORK/token" 2>>"$WORK/setup.log"
  quiet "$BIN/fleetlearn-edge" enroll --api "$GRPC" --ca "$FLEETLEARN_CA" --token-file "$WORK/token" \
    --data-dir "$WORK/edge/$k"
  # shellcheck disable=SC2086 # EDGE_FLAGS is a list of flags
  "$BIN/fleetlearn-edge" --data-dir "$WORK/edge/$k" --dataset "$DS/device-$k" --log-level info ${EDGE_FLAGS:-} \
    >"$WORK/edge/$k.log" 2>&1 &
  PIDS+=("$!")
  echo "edge-$k $!" >>"$WORK/pids"
done
rm -f "$WORK/token"
# Every agent connected before the task exists, so that round 1 can pick any.
for ((k = 0; k < DEVICES; k++)); do
  for i in $(seq 600); do
    grep -q "edge agent running" "$WORK/edge/$k.log" && break
    [[ $i -lt 600 ]] || { echo "agent $k did not start within 60 s: see $WORK/edge/$k.log" >&2; exit 1; }
    sleep 0.1
  done
done
echo "fleet up; creating the task"

"$PYTHON" "$HERE/fleet_monitor.py" --cli "$FL" --pids "$WORK/pids" --cohort "$COHORT" --target "$TARGET" \
  --out "$WORK/fleet.json" -- \
  "$FL" task create --name mnist-fleet --model mnist --module "$MODULE" --cohort "$COHORT" --over-selection 1 \
  --rule fedavg --rounds "$MAX_ROUNDS" --server-eval-dataset "$DS/eval" -o json
