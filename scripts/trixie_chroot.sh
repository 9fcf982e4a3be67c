#!/usr/bin/env bash
# A Debian 13 (trixie) chroot on a Debian 12 host: PyTorch 2.6 (Debian's python3-torch with
# OpenBLAS) for torch.distributed.pipelining, whose host version (1.13) is too old for it, and,
# with --build, the newer stack to build Stagecoach against (LibTorch 2.6, abseil 2024,
# yaml-cpp 0.8, gRPC 1.51). Needs root (debootstrap, chroot, mount).
#
#   scripts/trixie_chroot.sh DIR            make DIR once; later runs check it and mount
#   scripts/trixie_chroot.sh DIR --build    also the packages that build and test Stagecoach
#
# The mirror is the host's (the first URIs line of /etc/apt/sources.list.d/debian.sources, else
# deb.debian.org). /proc is mounted and /dev/shm bound (Gloo's shared memory); undo with
#   umount DIR/proc DIR/dev/shm
# Run PyTorch inside with USE_LIBUV=0 (Debian's torch has no libuv for its TCPStore), e.g.
#   chroot DIR env USE_LIBUV=0 python3 -c 'import torch; print(torch.__version__)'
set -euo pipefail
DIR="${1:?usage: scripts/trixie_chroot.sh DIR [--build]}"
BUILD="${2:-}"
log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
[ "$(id -u)" -eq 0 ] || { log "trixie_chroot.sh needs root (debootstrap, chroot, mount)"; exit 1; }

MIRROR="$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
PACKAGES=(python3-torch python3-numpy libopenblas0-openmp)
if [ "$BUILD" = "--build" ]; then
  # scripts/lib.sh's list, less what the tests in this chroot do not use (clang, fortunes).
  PACKAGES+=(build-essential cmake ninja-build ccache pkg-config libtorch-dev libgrpc++-dev
    protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev libssl-dev
    libyaml-cpp-dev libgloo-dev libspdlog-dev libcli11-dev nlohmann-json3-dev prometheus-cpp-dev
    libgtest-dev libgmock-dev libbenchmark-dev openssl unzip libsentencepiece-dev
    python3-sentencepiece python3-grpcio python3-protobuf python3-pip python3-venv
    python3-setuptools)
elif [ -n "$BUILD" ]; then
  log "unknown option $BUILD (expected --build)"
  exit 2
fi

if [ ! -x "$DIR/usr/bin/apt-get" ]; then
  if ! command -v debootstrap >/dev/null; then
    log "installing debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap \
      >/dev/null
  fi
  log "debootstrap trixie (minbase) into $DIR from $MIRROR"
  debootstrap --variant=minbase trixie "$DIR" "$MIRROR" >/dev/null
fi
mountpoint -q "$DIR/proc" || mount -t proc proc "$DIR/proc"
mkdir -p "$DIR/dev/shm"
mountpoint -q "$DIR/dev/shm" || mount --bind /dev/shm "$DIR/dev/shm"

missing=()
for p in "${PACKAGES[@]}"; do
  chroot "$DIR" dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${#missing[@]} packages in the chroot: ${missing[*]}"
  chroot "$DIR" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  chroot "$DIR" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
chroot "$DIR" env USE_LIBUV=0 python3 -c \
  'import torch, torch.distributed.pipelining; print("trixie chroot: PyTorch", torch.__version__)'
