#!/usr/bin/env bash
# Installs what is needed, builds, and runs the whole test suite (unit, integration, e2e; gpu
# tests report SKIPPED where there is no GPU). Extra arguments go to ctest, e.g.
#   scripts/test.sh -L unit
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

install_packages
build_tree
# The Helm chart tests (tests/deploy) run $STAGECOACH_HELM; without it they fail, saying so.
ensure_helm || log "no helm binary: the tests in tests/deploy will fail"
log "running the tests"
cd "$BUILD_DIR"
ctest --output-on-failure --timeout 600 -j "$(nproc 2>/dev/null || echo 2)" "$@"
