# syntax=docker/dockerfile:1
# The CPU worker image: stagecoach-worker built from this repository against Debian 12's LibTorch
# 1.13 (CPU only) and Gloo, the same packages scripts/lib.sh installs for a developer build, on a
# slim Debian 12 runtime. OpenBLAS (libopenblas0-openmp) replaces the reference BLAS that Debian's
# LibTorch calls through libblas.so.3. Build from the repository root:
#
#   docker build -f deploy/docker/worker-cpu.Dockerfile -t stagecoach/worker-cpu:0.1.0 .
#
# Ports: 7071 gRPC (WorkerService; gRPC health checks), 9091 Prometheus /metrics. The data plane
# (Gloo) listens on ports it picks itself. Fetched artifacts are cached under
# /var/cache/stagecoach. The coordinator's address comes from --coordinator or
# $STAGECOACH_COORDINATOR.

ARG BUILDER_IMAGE=debian:12
ARG RUNTIME_IMAGE=debian:12-slim

FROM ${BUILDER_IMAGE} AS builder
# scripts/lib.sh's build packages, less the test-only ones (python3-torch, gtest, gmock,
# benchmark) and ccache.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      build-essential cmake ninja-build pkg-config \
      libtorch-dev libopenblas0-openmp \
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler \
      libabsl-dev libssl-dev libyaml-cpp-dev libgloo-dev libspdlog-dev libcli11-dev \
      libsentencepiece-dev \
      nlohmann-json3-dev prometheus-cpp-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY CMakeLists.txt ./
COPY cmake cmake
COPY proto proto
COPY common common
COPY coordinator coordinator
COPY worker worker
COPY client client
COPY bench bench
# Only the worker and its tokenizer tool are built; the coordinator and client folders are
# configured because the top-level CMakeLists.txt adds them. No CUDA here, so no NCCL backend.
RUN cmake -S /src -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DSTAGECOACH_BUILD_TESTS=OFF -DSTAGECOACH_WITH_NCCL=OFF \
 && cmake --build /build --target stagecoach-worker stagecoach-sentencepiece \
 && strip /build/worker/stagecoach-worker /build/client/stagecoach-sentencepiece

FROM ${RUNTIME_IMAGE} AS runtime
# Runtime libraries: Debian's LibTorch 1.13 (libtorch1.13, which pulls its own dependencies),
# OpenBLAS for its BLAS, Gloo, gRPC and the rest of what stagecoach-worker loads.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libtorch1.13 libopenblas0-openmp libgloo0 \
      libgrpc++1.51 libgrpc29 libprotobuf32 libabsl20220623 libyaml-cpp0.7 libspdlog1.10 \
      libfmt9 libprometheus-cpp-core1.0 libssl3 libsentencepiece0 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 stagecoach \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/cache/stagecoach --no-create-home \
      --shell /usr/sbin/nologin stagecoach \
 && install -d -o 10001 -g 10001 /var/cache/stagecoach
COPY --from=builder /build/worker/stagecoach-worker /usr/local/bin/
# data.kind jsonl: the worker tokenizes records with the tool beside it
# (worker/runtime/data/jsonl_records.h).
COPY --from=builder /build/client/stagecoach-sentencepiece /usr/local/bin/
USER 10001:10001
WORKDIR /var/cache/stagecoach
EXPOSE 7071 9091
ENTRYPOINT ["/usr/local/bin/stagecoach-worker"]
CMD ["--listen", "0.0.0.0:7071", "--metrics-listen", "0.0.0.0:9091", \
     "--cache-dir", "/var/cache/stagecoach", "--device", "cpu"]
