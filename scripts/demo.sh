#!/usr/bin/env bash
# The main job, locally: installs what is needed (the Debian packages of scripts/lib.sh, the
# `fortunes` text and SentencePiece among them), builds the coordinator, the worker and stagectl
# (with stagecoach-sentencepiece), then runs scripts/demo_llama.sh: a SentencePiece tokenizer
# and a small Llama trained from scratch on English text through a 4-stage zero-bubble pipeline
# on two local workers, shown live, asked to write, exported in Hugging Face's layout and loaded
# back as a user's own model. STAGECOACH_DEMO=gpt runs the character-level GPT demo instead
# (scripts/demo_gpt.sh). STAGECOACH_DEMO_SHORT=1 runs a few steps only (what CI checks).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

install_packages
build_tree --target stagecoach-coordinator stagecoach-worker stagectl
if [ "${STAGECOACH_DEMO:-llama}" = gpt ]; then
  exec bash "$STAGECOACH_ROOT/scripts/demo_gpt.sh" "$BUILD_DIR"
fi
exec bash "$STAGECOACH_ROOT/scripts/demo_llama.sh" "$BUILD_DIR"
