#!/usr/bin/env bash
# The demo's job, on binaries already built (scripts/demo.sh builds them first):
#   scripts/demo_gpt.sh BUILD_DIR
# Starts a coordinator and two workers on loopback; turns 1.2 MB of English prose and quotations
# that Debian's `fortunes` package installs under /usr/share/games/fortunes into character tokens
# (`stagectl tokens`); trains a small GPT through a 4-stage ZBVZeroBubble pipeline (two stages per
# worker) with AdamW, a warmup + cosine learning rate, clipping and a validation pass on a
# held-out file, shown live by `stagectl watch`; checks that the final loss beats its bound; shows
# each worker's predicted and measured share of a step (`stagectl plan --job`); then writes
# text with the trained job (`stagectl generate`, from its final checkpoint). Stops every
# process it started, also on Ctrl-C or failure.
#
# STAGECOACH_DEMO_SHORT=1 trains a few steps only (what CI runs, via CTest's demo_short) and
# holds the loss to a looser bound.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${1:?usage: scripts/demo_gpt.sh BUILD_DIR}"
STAGECTL="$BIN/client/stagectl"
FORTUNES=/usr/share/games/fortunes
# Training text, and the held-out file the validation pass reads.
TRAIN_FILES=(people science politics work men-women literature humorists education platitudes
  miscellaneous law love food definitions)
HELD_OUT=wisdom

if [ "${STAGECOACH_DEMO_SHORT:-0}" = 1 ]; then
  STEPS=40 WARMUP=10 EVAL_EVERY=20 GENERATE=60
  # A uniform guess over the ~100 characters scores ln(101) = 4.62; after 40 steps the model
  # knows at least the characters' frequencies (3.26 on this text).
  BOUND=3.6
else
  STEPS=700 WARMUP=40 EVAL_EVERY=100 GENERATE=400
  # Character frequencies alone give 3.26: beating 2.1 takes the context into account.
  BOUND=2.1
fi

source "$ROOT/scripts/demo_lib.sh"

log "stagectl tokens: fortunes text -> character tokens"
"$STAGECTL" tokens build "${TRAIN_FILES[@]/#/$FORTUNES/}" "$FORTUNES/$HELD_OUT" \
  --vocab "$RUN_DIR/vocab.json" --out "$RUN_DIR/all.bin"
"$STAGECTL" tokens encode "${TRAIN_FILES[@]/#/$FORTUNES/}" --vocab "$RUN_DIR/vocab.json" \
  --out "$RUN_DIR/train.bin"
"$STAGECTL" tokens encode "$FORTUNES/$HELD_OUT" --vocab "$RUN_DIR/vocab.json" \
  --out "$RUN_DIR/held-out.bin"
VOCAB="$(/usr/bin/python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["chars"]))' \
  "$RUN_DIR/vocab.json")"

cat >"$RUN_DIR/gpt-fortunes.yaml" <<SPEC
# A character-level GPT on the fortunes text: 8 blocks in 4 stages on 2 workers
# (ZBVZeroBubble's V: worker 0 holds stages 0 and 3, so the tied embedding and head share it;
# worker 1 stages 1 and 2). The split is left to its default: the coordinator profiles the
# model on a worker and balances the two workers' measured compute, not the four stages'.
name: gpt-fortunes
model:
  builtin: {family: gpt, vocab: $VOCAB, d_model: 128, layers: 8, heads: 4, seq: 64, seed: 1,
            tie_embeddings: true}
split: {stages: 4}
schedule: {kind: ZBVZeroBubble, microbatches: 8}
placement: {workers: 2}
training:
  batch_size: 32
  steps: $STEPS
  loss: cross_entropy
  optimizer: {kind: adamw, lr: 0.003, weight_decay: 0.01}
  lr_schedule: {kind: cosine, warmup_steps: $WARMUP, min_lr: 0.0003}
  grad_clip: {max_norm: 1.0}
  checkpoint: {dir: $RUN_DIR/checkpoints}
data: {kind: tokens, path: $RUN_DIR/train.bin, seed: 1}
eval:
  every_steps: $EVAL_EVERY
  batches: 4
  data: {kind: tokens, path: $RUN_DIR/held-out.bin, seed: 2}
SPEC

log "stagectl submit gpt-fortunes.yaml ($STEPS steps; spec: $RUN_DIR/gpt-fortunes.yaml)"
JOB="$("$STAGECTL" submit "$RUN_DIR/gpt-fortunes.yaml")"
"$STAGECTL" watch "$JOB"

check_final_loss "$JOB" "$BOUND"

log "stagectl plan --job $JOB: each worker's predicted and measured share of a step"
"$STAGECTL" plan --job "$JOB"

log "stagectl generate $JOB --prompt 'The meaning of life is' (from its final checkpoint)"
"$STAGECTL" generate "$JOB" --vocab "$RUN_DIR/vocab.json" --prompt "The meaning of life is" \
  --tokens "$GENERATE" --temperature 0.8 --top-k 20 --seed 1
