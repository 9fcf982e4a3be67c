# syntax=docker/dockerfile:1
# The CUDA worker image: stagecoach-worker built from this repository against LibTorch with CUDA
# and NCCL, so that workers run stages on GPUs (--device cuda[:N]) and move activations with
# NCCL (placement.transport nccl or auto). Build from the repository root:
#
#   docker build -f deploy/docker/worker-cuda.Dockerfile -t stagecoach/worker-cuda:0.1.0 .
#
# Where each part comes from (see docs/deploy.md, "The CUDA worker image"):
# - The operating system and every other library (gRPC, protobuf, abseil, Gloo, yaml-cpp, spdlog,
#   prometheus-cpp, OpenSSL) are Debian 12's packages, by the same names as scripts/lib.sh, as in
#   the CPU images: one set of versions for all three images.
# - The CUDA toolkit (nvcc, the CUDA runtime) and NCCL come from NVIDIA's nvidia/cuda devel image
#   (CUDA_IMAGE), whose apt set-up installs libnccl2/libnccl-dev: the toolkit directory is
#   relocatable, and NCCL's header and libraries are copied beside it. The build sets
#   STAGECOACH_WITH_NCCL=ON, so it fails rather than quietly building the worker without NCCL.
# - LibTorch with CUDA is PyTorch's official C++ distribution (LIBTORCH_URL: a
#   cxx11-ABI "shared-with-deps" zip, whose lib/ bundles the CUDA math libraries and cuDNN it
#   needs). The cxx11 ABI matters: the worker shares std::string with Debian's gRPC and abseil.
#   Its CUDA version should match CUDA_IMAGE's.
#
# Ports: 7071 gRPC (WorkerService; gRPC health checks), 9091 Prometheus /metrics. Gloo and NCCL
# listen on ports they pick themselves. Run it with the NVIDIA container runtime (Kubernetes:
# the NVIDIA device plugin and an `nvidia.com/gpu` limit), which mounts the driver.

ARG BUILDER_IMAGE=debian:12
ARG RUNTIME_IMAGE=debian:12-slim
ARG CUDA_IMAGE=nvidia/cuda:12.4.1-devel-ubuntu22.04
ARG CUDA_VERSION_DIR=cuda-12.4

# The CUDA toolkit and NCCL, gathered into two folders (cp -a keeps the .so symlinks).
FROM ${CUDA_IMAGE} AS cuda
ARG CUDA_VERSION_DIR
RUN mkdir -p /nccl/include /nccl/lib /cudart \
 && cp -a /usr/include/nccl*.h /nccl/include/ \
 && cp -a /usr/lib/x86_64-linux-gnu/libnccl.so* /nccl/lib/ \
 && cp -a /usr/local/${CUDA_VERSION_DIR}/targets/x86_64-linux/lib/libcudart.so* /cudart/

FROM ${BUILDER_IMAGE} AS builder
ARG CUDA_VERSION_DIR
ARG LIBTORCH_URL=https://download.pytorch.org/libtorch/cu124/libtorch-cxx11-abi-shared-with-deps-2.5.1%2Bcu124.zip
# scripts/lib.sh's build packages, less Debian's CPU-only LibTorch (libtorch-dev), the test-only
# ones (python3-torch, gtest, gmock, benchmark) and ccache; curl and unzip fetch LibTorch.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      build-essential cmake ninja-build pkg-config ca-certificates curl unzip \
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler \
      libabsl-dev libssl-dev libyaml-cpp-dev libgloo-dev libspdlog-dev libcli11-dev \
      libsentencepiece-dev \
      nlohmann-json3-dev prometheus-cpp-dev \
 && rm -rf /var/lib/apt/lists/*
COPY --from=cuda /usr/local/${CUDA_VERSION_DIR} /usr/local/${CUDA_VERSION_DIR}
COPY --from=cuda /nccl /opt/nccl
RUN ln -s /usr/local/${CUDA_VERSION_DIR} /usr/local/cuda \
 && curl -fsSL -o /tmp/libtorch.zip "${LIBTORCH_URL}" \
 && unzip -q /tmp/libtorch.zip -d /opt \
 && rm /tmp/libtorch.zip \
 && test -f /opt/libtorch/share/cmake/Torch/TorchConfig.cmake
ENV PATH=/usr/local/cuda/bin:${PATH}
WORKDIR /src
COPY CMakeLists.txt ./
COPY cmake cmake
COPY proto proto
COPY common common
COPY coordinator coordinator
COPY worker worker
COPY client client
COPY bench bench
RUN cmake -S /src -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DSTAGECOACH_BUILD_TESTS=OFF -DSTAGECOACH_WITH_NCCL=ON \
      -DCMAKE_PREFIX_PATH=/opt/libtorch -DCUDAToolkit_ROOT=/usr/local/cuda -DNCCL_ROOT=/opt/nccl \
 && cmake --build /build --target stagecoach-worker stagecoach-sentencepiece \
 && strip /build/worker/stagecoach-worker /build/client/stagecoach-sentencepiece

FROM ${RUNTIME_IMAGE} AS runtime
# Debian 12 runtime libraries (as in worker-cpu.Dockerfile, without Debian's LibTorch), then
# LibTorch's lib/, the CUDA runtime and NCCL at the paths the worker was linked against.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libgomp1 libgloo0 \
      libgrpc++1.51 libgrpc29 libprotobuf32 libabsl20220623 libyaml-cpp0.7 libspdlog1.10 \
      libfmt9 libprometheus-cpp-core1.0 libssl3 libsentencepiece0 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 stagecoach \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/cache/stagecoach --no-create-home \
      --shell /usr/sbin/nologin stagecoach \
 && install -d -o 10001 -g 10001 /var/cache/stagecoach
COPY --from=builder /opt/libtorch/lib /opt/libtorch/lib
COPY --from=cuda /nccl/lib /opt/nccl/lib
COPY --from=cuda /cudart /usr/local/cuda/lib64
RUN printf '%s\n' /opt/libtorch/lib /opt/nccl/lib /usr/local/cuda/lib64 \
      > /etc/ld.so.conf.d/stagecoach.conf \
 && ldconfig
COPY --from=builder /build/worker/stagecoach-worker /usr/local/bin/
# data.kind jsonl: the worker tokenizes records with the tool beside it
# (worker/runtime/data/jsonl_records.h).
COPY --from=builder /build/client/stagecoach-sentencepiece /usr/local/bin/
# What the NVIDIA container runtime reads to mount the driver (nvidia/cuda images set the same).
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001
WORKDIR /var/cache/stagecoach
EXPOSE 7071 9091
ENTRYPOINT ["/usr/local/bin/stagecoach-worker"]
CMD ["--listen", "0.0.0.0:7071", "--metrics-listen", "0.0.0.0:9091", \
     "--cache-dir", "/var/cache/stagecoach", "--device", "cuda"]
