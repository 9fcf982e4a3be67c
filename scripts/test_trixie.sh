#!/usr/bin/env bash
# Builds Stagecoach against Debian 13's newer stack (LibTorch 2.6, abseil 2024, yaml-cpp 0.8,
# gRPC 1.51) in a trixie chroot and runs its unit and integration tests there, so that the CUDA
# image (LibTorch 2.5) and GPU machines (PyTorch 2.11) do not meet an API that was only ever
# compiled against Debian 12's LibTorch 1.13. Not part of .ci/run (it downloads about 1 GB and
# builds the tree a second time). Needs root.
#
#   scripts/test_trixie.sh [CTEST ARGS...]     default: -L 'unit|integration'
#
# TRIXIE_DIR is the chroot (default /var/tmp/stagecoach-trixie; scripts/trixie_chroot.sh makes
# it). The source tree is bound read-only at /stagecoach inside it and built in
# /build-trixie; the Helm chart tests get this host's helm (scripts/lib.sh ensure_helm).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
TRIXIE_DIR="${TRIXIE_DIR:-/var/tmp/stagecoach-trixie}"

bash "$STAGECOACH_ROOT/scripts/trixie_chroot.sh" "$TRIXIE_DIR" --build
mkdir -p "$TRIXIE_DIR/stagecoach"
if ! mountpoint -q "$TRIXIE_DIR/stagecoach"; then
  mount --bind "$STAGECOACH_ROOT" "$TRIXIE_DIR/stagecoach"
  mount -o remount,bind,ro "$TRIXIE_DIR/stagecoach"
fi
helm_env=()
if ensure_helm; then
  install -m 0755 "$STAGECOACH_HELM" "$TRIXIE_DIR/usr/local/bin/helm"
  helm_env=(STAGECOACH_HELM=/usr/local/bin/helm)
fi

in_chroot() { chroot "$TRIXIE_DIR" env USE_LIBUV=0 HOME=/root "${helm_env[@]}" "$@"; }
in_chroot dpkg-query -W -f='${Package} ${Version}\n' libtorch-dev libabsl-dev libgrpc++-dev \
  libyaml-cpp-dev libprotobuf-dev python3-torch
if [ ! -f "$TRIXIE_DIR/build-trixie/build.ninja" ]; then
  log "configuring /build-trixie in the chroot"
  in_chroot cmake -S /stagecoach -B /build-trixie -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DSTAGECOACH_BUILD_BENCHES=ON >/dev/null
fi
log "building in the chroot ($(nproc) jobs)"
in_chroot cmake --build /build-trixie -j "$(nproc)"
log "testing in the chroot"
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(-L 'unit|integration')
in_chroot sh -c 'cd /build-trixie && exec ctest --output-on-failure --timeout 600 -j "$0" "$@"' \
  "$(nproc)" "${args[@]}"
