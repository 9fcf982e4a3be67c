#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang in build-fuzz (only the sources they
# exercise; no LibTorch or gRPC) and runs each, one at a time, for SECONDS (default 60) on a copy
# of its seed corpus (tests/fuzz/corpus/<target>). Prints per target the executions and the
# result, and exits non-zero when any target crashed, failed a sanitizer check, timed out on one
# input (10 s) or ran out of memory (2 GB); the input that did it is left in
# build-fuzz/fuzz-run/<target>/ and the last lines of its log are printed. Make it a unit test
# (tests/fuzz/README.md).
#   scripts/fuzz.sh [SECONDS] [TARGET...]      e.g. scripts/fuzz.sh 30 schedule_csv npy
# JOBS caps the build's parallel jobs (default: all cores); FUZZ_BUILD_DIR moves build-fuzz.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SECONDS_EACH="${1:-60}"
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=(spec_parser schedule_csv schedule_action npy checkpoint_manifest safetensors_header)
FUZZ_DIR="${FUZZ_BUILD_DIR:-$STAGECOACH_ROOT/build-fuzz}"

install_packages
if [ ! -f "$FUZZ_DIR/build.ninja" ]; then
  log "configuring $FUZZ_DIR (clang, STAGECOACH_FUZZ=ON)"
  CC=clang CXX=clang++ cmake -S "$STAGECOACH_ROOT" -B "$FUZZ_DIR" -G Ninja \
    -DSTAGECOACH_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
log "building the fuzz targets"
build_start=$(date +%s)
cmake --build "$FUZZ_DIR" -j "${JOBS:-$(nproc 2>/dev/null || echo 2)}" \
  --target "${TARGETS[@]/%/_fuzz}"
log "fuzz build took $(( $(date +%s) - build_start )) s"

failed=0
summary=()
for t in "${TARGETS[@]}"; do
  run="$FUZZ_DIR/fuzz-run/$t"
  rm -rf "$run"
  mkdir -p "$run/corpus"
  cp "$STAGECOACH_ROOT/tests/fuzz/corpus/$t/"* "$run/corpus/"
  log "fuzzing $t for ${SECONDS_EACH} s"
  start=$(date +%s)
  rc=0
  "$FUZZ_DIR/tests/fuzz/${t}_fuzz" "$run/corpus" -max_total_time="$SECONDS_EACH" -timeout=10 \
    -rss_limit_mb=2048 -max_len=4096 -print_final_stats=1 -artifact_prefix="$run/" \
    >"$run/log" 2>&1 || rc=$?
  took=$(( $(date +%s) - start ))
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$run/log" | tail -1)"
  if [ "$rc" -eq 0 ]; then
    result="ok"
  else
    failed=1
    artifacts="$(ls "$run" | grep -E '^(crash|leak|timeout|oom|slow-unit)-' | sed "s|^|$run/|" | tr '\n' ' ' || true)"
    result="FAILED (exit $rc): ${artifacts:-no input saved; see $run/log}"
    tail -n 40 "$run/log" >&2
  fi
  summary+=("$(printf '%-20s %12s execs %5s s  %s' "$t" "${execs:-?}" "$took" "$result")")
done
log "fuzz summary"
printf '%s\n' "${summary[@]}"
exit "$failed"
