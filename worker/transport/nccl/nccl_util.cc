#include "worker/transport/nccl/nccl_util.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace stagecoach::transport {
namespace {

absl::StatusCode NcclCode(ncclResult_t result) {
  return result == ncclRemoteError ? absl::StatusCode::kUnavailable : absl::StatusCode::kInternal;
}

// Waits until the nonblocking `comm` is ready or `deadline`. Aborts it on failure.
absl::Status AwaitCommunicator(ncclComm_t comm, ncclResult_t initial, absl::Time deadline,
                               absl::Duration connect_timeout, int world_size) {
  if (initial != ncclSuccess && initial != ncclInProgress) {
    absl::Status error = NcclError("ncclCommInitRankConfig", initial, comm);
    if (comm != nullptr) ncclCommAbort(comm);
    return error;
  }
  absl::Duration pause = absl::Microseconds(100);
  while (true) {
    absl::StatusOr<bool> ready = CommReady(comm, "ncclCommInitRankConfig (asynchronous)");
    if (!ready.ok()) {
      ncclCommAbort(comm);
      return ready.status();
    }
    if (*ready) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      ncclCommAbort(comm);
      return absl::DeadlineExceededError(
          absl::StrFormat("not every one of the %d ranks joined the NCCL communicator within %s",
                          world_size, absl::FormatDuration(connect_timeout)));
    }
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Milliseconds(10));
  }
}

}  // namespace

absl::Status CudaError(absl::string_view call, cudaError_t error) {
  return absl::InternalError(absl::StrFormat("%s failed: %s (%s)", call, cudaGetErrorName(error),
                                             cudaGetErrorString(error)));
}

absl::Status NcclError(absl::string_view call, ncclResult_t result, ncclComm_t comm) {
  std::string message = absl::StrFormat("%s failed: %s (ncclResult_t %d)", call,
                                        ncclGetErrorString(result), static_cast<int>(result));
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') absl::StrAppend(&message, ": ", last);
  return absl::Status(NcclCode(result), message);
}

absl::Status WithPrefix(const absl::Status& status, absl::string_view prefix) {
  return absl::Status(status.code(), absl::StrCat(prefix, status.message()));
}

DeviceGuard::DeviceGuard(int device) {
  cudaError_t error = cudaGetDevice(&previous_);
  if (error == cudaSuccess && previous_ != device) {
    error = cudaSetDevice(device);
    restore_ = error == cudaSuccess;
  }
  if (error != cudaSuccess) status_ = CudaError("cudaSetDevice", error);
}

DeviceGuard::~DeviceGuard() {
  if (restore_) cudaSetDevice(previous_);
}

absl::Status CheckCudaDevice(int cuda_device) {
  int devices = 0;
  const cudaError_t counted = cudaGetDeviceCount(&devices);
  if (counted != cudaSuccess || devices == 0) {
    cudaGetLastError();  // Clears the error.
    return absl::FailedPreconditionError(
        counted != cudaSuccess
            ? absl::StrCat("no CUDA device: ", CudaError("cudaGetDeviceCount", counted).message())
            : "no CUDA device: cudaGetDeviceCount returned 0");
  }
  if (cuda_device < 0 || cuda_device >= devices) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cuda_device %d is not in [0, %d)", cuda_device, devices));
  }
  return absl::OkStatus();
}

std::string EncodeId(const ncclUniqueId& id) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * sizeof(id.internal));
  for (char c : id.internal) {
    const auto byte = static_cast<unsigned char>(c);
    out.push_back(kDigits[byte >> 4]);
    out.push_back(kDigits[byte & 0xf]);
  }
  return out;
}

std::optional<ncclUniqueId> DecodeId(absl::string_view hex) {
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  ncclUniqueId id;
  if (hex.size() != 2 * sizeof(id.internal)) return std::nullopt;
  for (size_t i = 0; i < sizeof(id.internal); ++i) {
    const int high = nibble(hex[2 * i]);
    const int low = nibble(hex[2 * i + 1]);
    if (high < 0 || low < 0) return std::nullopt;
    id.internal[i] = static_cast<char>(high << 4 | low);
  }
  return id;
}

absl::StatusOr<ncclUniqueId> PublishUniqueId(RendezvousStore* store, const std::string& key) {
  ncclUniqueId id;
  const ncclResult_t result = ncclGetUniqueId(&id);
  if (result != ncclSuccess) return NcclError("ncclGetUniqueId", result, nullptr);
  absl::Status published = store->Set(key, EncodeId(id));
  if (!published.ok()) return WithPrefix(published, absl::StrFormat("publishing \"%s\": ", key));
  return id;
}

absl::StatusOr<ncclUniqueId> ReadUniqueId(RendezvousStore* store, const std::string& key, int owner,
                                          absl::Duration timeout) {
  absl::StatusOr<std::string> value = store->Get(key, timeout);
  if (!value.ok()) {
    const std::string waiting =
        absl::StrFormat("waiting for rank %d's NCCL unique id (\"%s\"): ", owner, key);
    return WithPrefix(value.status(), waiting);
  }
  std::optional<ncclUniqueId> decoded = DecodeId(*value);
  if (!decoded.has_value()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "\"%s\" holds %d bytes that are not a hex-encoded NCCL unique id", key, value->size()));
  }
  return *decoded;
}

absl::StatusOr<bool> CommReady(ncclComm_t comm, absl::string_view what) {
  ncclResult_t state = ncclSuccess;
  const ncclResult_t result = ncclCommGetAsyncError(comm, &state);
  if (result != ncclSuccess) return NcclError("ncclCommGetAsyncError", result, comm);
  if (state == ncclSuccess) return true;
  if (state == ncclInProgress) return false;
  return NcclError(what, state, comm);
}

absl::StatusOr<ncclComm_t> JoinCommunicator(const ConnectOptions& options, RendezvousStore* store,
                                            absl::Time deadline) {
  const std::string key = options.key_prefix + "nccl_unique_id";
  absl::StatusOr<ncclUniqueId> id = options.rank == 0
                                        ? PublishUniqueId(store, key)
                                        : ReadUniqueId(store, key, 0, options.connect_timeout);
  if (!id.ok()) return id.status();
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t initial =
      ncclCommInitRankConfig(&comm, options.world_size, *id, options.rank, &config);
  absl::Status joined =
      AwaitCommunicator(comm, initial, deadline, options.connect_timeout, options.world_size);
  if (!joined.ok()) return joined;
  return comm;
}

void FinalizeAndDestroy(const std::vector<ncclComm_t>& comms, absl::Duration timeout) {
  std::vector<ncclComm_t> finalizing, finalized;
  for (ncclComm_t comm : comms) {
    const ncclResult_t result = ncclCommFinalize(comm);
    if (result == ncclSuccess || result == ncclInProgress) finalizing.push_back(comm);
  }
  const absl::Time deadline = absl::Now() + timeout;
  while (!finalizing.empty()) {
    for (auto it = finalizing.begin(); it != finalizing.end();) {
      absl::StatusOr<bool> ready = CommReady(*it, "ncclCommFinalize (asynchronous)");
      if (ready.ok() && !*ready) {
        ++it;
        continue;
      }
      if (ready.ok()) finalized.push_back(*it);
      it = finalizing.erase(it);  // Finalized, or failed: aborted below.
    }
    if (finalizing.empty() || absl::Now() >= deadline) break;
    absl::SleepFor(absl::Microseconds(100));
  }
  for (ncclComm_t comm : finalized) ncclCommDestroy(comm);
  for (ncclComm_t comm : comms) {
    if (std::find(finalized.begin(), finalized.end(), comm) == finalized.end()) {
      ncclCommAbort(comm);
    }
  }
}

}  // namespace stagecoach::transport
