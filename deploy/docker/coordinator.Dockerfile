# syntax=docker/dockerfile:1
# The coordinator image: stagecoach-coordinator (and stagectl, for `kubectl exec`) built from this
# repository without LibTorch or Gloo (-DSTAGECOACH_BUILD_WORKER=OFF), on a slim Debian 12
# runtime with only the shared libraries the two binaries load. Build from the repository root:
#
#   docker build -f deploy/docker/coordinator.Dockerfile -t stagecoach/coordinator:0.1.0 .
#
# Ports: 7070 gRPC (clients and workers; gRPC health checks), 9090 Prometheus /metrics.
# State (job table, uploaded artifacts) lives under /var/lib/stagecoach: mount a volume there.

ARG BUILDER_IMAGE=debian:12
ARG RUNTIME_IMAGE=debian:12-slim

FROM ${BUILDER_IMAGE} AS builder
# The build packages of scripts/lib.sh that the LibTorch-free targets need.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      build-essential cmake ninja-build pkg-config \
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler \
      libabsl-dev libssl-dev libyaml-cpp-dev libspdlog-dev libcli11-dev nlohmann-json3-dev \
      libsentencepiece-dev \
      prometheus-cpp-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY CMakeLists.txt ./
COPY cmake cmake
COPY proto proto
COPY common common
COPY coordinator coordinator
COPY client client
COPY bench bench
RUN cmake -S /src -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DSTAGECOACH_BUILD_WORKER=OFF -DSTAGECOACH_BUILD_TESTS=OFF \
 && cmake --build /build --target stagecoach-coordinator stagectl stagecoach-sentencepiece \
 && strip /build/coordinator/stagecoach-coordinator /build/client/stagectl \
      /build/client/stagecoach-sentencepiece

FROM ${RUNTIME_IMAGE} AS runtime
# Runtime libraries of the binaries (readelf -d NEEDED on a Debian 12 build).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libgrpc++1.51 libgrpc29 libprotobuf32 libabsl20220623 libyaml-cpp0.7 libspdlog1.10 \
      libfmt9 libprometheus-cpp-core1.0 libssl3 libsentencepiece0 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 stagecoach \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/stagecoach --no-create-home \
      --shell /usr/sbin/nologin stagecoach \
 && install -d -o 10001 -g 10001 /var/lib/stagecoach
COPY --from=builder /build/coordinator/stagecoach-coordinator /usr/local/bin/
COPY --from=builder /build/client/stagectl /build/client/stagecoach-sentencepiece /usr/local/bin/
USER 10001:10001
WORKDIR /var/lib/stagecoach
EXPOSE 7070 9090
ENTRYPOINT ["/usr/local/bin/stagecoach-coordinator"]
CMD ["--listen", "0.0.0.0:7070", "--metrics-listen", "0.0.0.0:9090", \
     "--data-dir", "/var/lib/stagecoach"]
