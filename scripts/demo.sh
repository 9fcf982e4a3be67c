#!/usr/bin/env bash
# The main job, locally: installs what is needed (the Debian packages of scripts/lib.sh, the
# `fortunes` text among them), builds the coordinator, the worker and stagectl, then runs
# scripts/demo_gpt.sh: a character-level GPT trained on English text through a 4-stage
# zero-bubble pipeline on two local workers, shown live, then asked to write.
# STAGECOACH_DEMO_SHORT=1 runs a few steps only (what CI checks).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

install_packages
build_tree --target stagecoach-coordinator stagecoach-worker stagectl
exec bash "$STAGECOACH_ROOT/scripts/demo_gpt.sh" "$BUILD_DIR"
