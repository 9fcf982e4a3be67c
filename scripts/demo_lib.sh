# Shared by the demos (scripts/demo_gpt.sh, scripts/demo_llama.sh), sourced after they set
# ROOT, BIN, STAGECTL, FORTUNES, TRAIN_FILES and HELD_OUT: logging, the check that the fortunes
# text is there, a run directory removed on success, a local coordinator and two workers on
# loopback stopped on exit (also on Ctrl-C or failure), and the final loss's check.

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

for f in "${TRAIN_FILES[@]}" "$HELD_OUT"; do
  [ -f "$FORTUNES/$f" ] || { log "missing $FORTUNES/$f: install the Debian package fortunes"; exit 1; }
done

RUN_DIR="$(mktemp -d "${TMPDIR:-/tmp}/stagecoach-demo.XXXXXX")"
PIDS=()
cleanup() {
  local status=$?
  trap - EXIT INT TERM
  if [ ${#PIDS[@]} -gt 0 ]; then
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

log "starting a coordinator and 2 workers on loopback (logs: $RUN_DIR)"
start_daemon coordinator "$BIN/coordinator/stagecoach-coordinator" \
  --listen 127.0.0.1:0 --lease 5s --heartbeat-interval 1s
export STAGECOACH_COORDINATOR="$ADDRESS"
for i in 0 1; do
  start_daemon "worker-$i" "$BIN/worker/stagecoach-worker" --listen 127.0.0.1:0 --name "worker-$i"
done

# check_final_loss JOB BOUND: prints the first and final losses (the mean of the last 20 steps)
# and the latest held-out loss; fails unless the final loss is below BOUND.
check_final_loss() {
  "$STAGECTL" status "$1" --history -o json | /usr/bin/python3 -c '
import json, sys
bound = float(sys.argv[1])
job = json.load(sys.stdin)
losses = job["losses"]
last = losses[-min(20, len(losses)):]
final = sum(last) / len(last)
print(f"first loss {losses[0]:.3f}; final loss (mean of the last {len(last)} steps) {final:.3f}; "
      f"bound {bound}")
for e in job.get("evals", [])[-1:]:
    step, held_out = e.get("global_step", "?"), e["loss"]
    print(f"held-out loss after step {step}: {held_out:.3f}")
if not final < bound:
    sys.exit(f"the final loss {final:.3f} did not beat its bound {bound}")
' "$2"
}
