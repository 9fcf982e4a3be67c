#!/usr/bin/env bash
# The main job, locally: installs what is needed, builds, starts a coordinator and four workers
# on loopback, trains an MLP through a 2-stage GPipe pipeline and a 4-stage 1F1B pipeline with
# stagectl, prints the losses, and stops every process it started (also on Ctrl-C or failure).
# Arguments, if any, are spec files to run instead of the two examples.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

install_packages
build_tree --target stagecoach-coordinator stagecoach-worker stagectl

BIN="$BUILD_DIR"
RUN_DIR="$(mktemp -d "${TMPDIR:-/tmp}/stagecoach-demo.XXXXXX")"
PIDS=()
cleanup() {
  local status=$?
  trap - EXIT INT TERM
  if [ ${#PIDS[@]} -gt 0 ]; then
    log "stopping ${#PIDS[@]} processes"
    kill -TERM "${PIDS[@]}" 2>/dev/null || true
    for _ in $(seq 50); do
      kill -0 "${PIDS[@]}" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "${PIDS[@]}" 2>/dev/null || true
    wait "${PIDS[@]}" 2>/dev/null || true
  fi
  if [ $status -ne 0 ]; then
    log "failed (exit $status); logs are in $RUN_DIR"
  else
    rm -rf "$RUN_DIR"
  fi
  exit $status
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Starts a daemon with its stdout in $RUN_DIR/$name.out, waits for its "listening on" line and
# sets ADDRESS to the address it printed. (Not in a $(...) subshell: PIDS must see the pid.)
start_daemon() {
  local name="$1"
  shift
  "$@" >"$RUN_DIR/$name.out" 2>"$RUN_DIR/$name.log" &
  PIDS+=($!)
  for _ in $(seq 300); do
    if grep -q "^listening on " "$RUN_DIR/$name.out" 2>/dev/null; then
      ADDRESS="$(sed -n 's/^listening on //p' "$RUN_DIR/$name.out" | head -1)"
      return 0
    fi
    kill -0 "$!" 2>/dev/null || { cat "$RUN_DIR/$name.log" >&2; return 1; }
    sleep 0.1
  done
  echo "$name did not start within 30s" >&2
  return 1
}

log "starting a coordinator and 4 workers on loopback (logs: $RUN_DIR)"
start_daemon coordinator "$BIN/coordinator/stagecoach-coordinator" \
  --listen 127.0.0.1:0 --lease 5s --heartbeat-interval 1s
export STAGECOACH_COORDINATOR="$ADDRESS"
for i in 0 1 2 3; do
  start_daemon "worker-$i" "$BIN/worker/stagecoach-worker" --listen 127.0.0.1:0 \
    --name "worker-$i"
done
for _ in $(seq 100); do
  idle="$("$BIN/client/stagectl" workers | grep -c " IDLE " || true)"
  [ "$idle" -ge 4 ] && break
  sleep 0.1
done
"$BIN/client/stagectl" workers

SPECS=("$@")
if [ ${#SPECS[@]} -eq 0 ]; then
  SPECS=("$STAGECOACH_ROOT/configs/mlp-2stage-gpipe.yaml" "$STAGECOACH_ROOT/configs/mlp-4stage-1f1b.yaml")
fi
for spec in "${SPECS[@]}"; do
  log "stagectl submit $(basename "$spec") --wait"
  job="$("$BIN/client/stagectl" submit "$spec" --wait | tail -1)"
  "$BIN/client/stagectl" status "$job" -o json | /usr/bin/python3 -c '
import json, sys
job = json.load(sys.stdin)
losses = job["losses"]
every = max(1, len(losses) // 10)
print(f"{job['"'"'id'"'"']} ({job['"'"'name'"'"']}): {job['"'"'schedule'"'"']}, {job['"'"'num_stages'"'"']} stages, "
      f"{job['"'"'microbatches'"'"']} microbatches, {job['"'"'state'"'"']}")
for i in sorted(set(range(0, len(losses), every)) | {len(losses) - 1}):
    print(f"  step {i + 1:4d}  loss {losses[i]:.4f}")
if len(losses) >= 20:
    head = sum(losses[:10]) / 10
    tail = sum(losses[-10:]) / 10
    print(f"  mean loss of the first 10 steps {head:.4f}, of the last 10 {tail:.4f}")
    if not tail < head:
        sys.exit("the loss did not fall")
'
done
"$BIN/client/stagectl" list
