// The NCCL backend of Transport (factory.h): CUDA runtime API and NCCL C API only, no LibTorch.
// The Endpoint (endpoint.h) carries the transfers; this file creates the communicators, streams
// and channels and wraps them.
//
// Creation. Rank 0 publishes the world communicator's ncclUniqueId in the rendezvous store as
// hex; every rank joins. Then, for each link, the lower rank of the pair publishes a unique id
// under "link/<link>/<lo>-<hi>" (all of its links first, then it reads the others', so no rank
// waits for one that waits for it), and each rank initializes all of its link communicators
// inside one ncclGroupStart/ncclGroupEnd, so that NCCL joins them concurrently and the order in
// which ranks list or reach them cannot deadlock. Everything is bounded by connect_timeout.
//
#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/util/status_macros.h"
#include "worker/transport/adapter.h"
#include "worker/transport/nccl/endpoint.h"
#include "worker/transport/nccl/factory.h"
#include "worker/transport/nccl/nccl_util.h"

namespace stagecoach::transport {
namespace {

using adapter::Hex;
using nccl_internal::Channel;

std::string LinkName(const NcclLink& link) {
  return absl::StrFormat("link %s with rank %d", Hex(link.link), link.peer);
}

// Creates this rank's communicator of every link (element i is links[i]'s), all joined, or
// none: see "Creation" above. Bounded by `deadline`.
absl::StatusOr<std::vector<ncclComm_t>> CreateLinkComms(const NcclOptions& options,
                                                        RendezvousStore* store,
                                                        absl::Time deadline) {
  const std::vector<NcclLink>& links = options.links;
  const size_t n = links.size();
  auto key_of = [&](const NcclLink& link) {
    return absl::StrFormat("%slink/%s/%d-%d", options.key_prefix, Hex(link.link),
                           std::min(options.rank, link.peer), std::max(options.rank, link.peer));
  };
  std::vector<ncclUniqueId> ids(n);
  // Publish the ids of the links this rank leads before waiting for any other's.
  for (size_t i = 0; i < n; ++i) {
    if (options.rank > links[i].peer) continue;
    absl::StatusOr<ncclUniqueId> id = PublishUniqueId(store, key_of(links[i]));
    if (!id.ok()) return WithPrefix(id.status(), absl::StrCat(LinkName(links[i]), ": "));
    ids[i] = *id;
  }
  for (size_t i = 0; i < n; ++i) {
    if (options.rank < links[i].peer) continue;
    absl::StatusOr<ncclUniqueId> id =
        ReadUniqueId(store, key_of(links[i]), links[i].peer,
                     std::max(deadline - absl::Now(), absl::ZeroDuration()));
    if (!id.ok()) return WithPrefix(id.status(), absl::StrCat(LinkName(links[i]), ": "));
    ids[i] = *id;
  }

  // One group: NCCL joins them all concurrently, whatever order the peers create theirs in.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  std::vector<ncclComm_t> comms(n, nullptr);
  absl::Status error;
  ncclResult_t result = ncclGroupStart();
  if (result != ncclSuccess) return NcclError("ncclGroupStart", result, nullptr);
  for (size_t i = 0; i < n; ++i) {
    result =
        ncclCommInitRankConfig(&comms[i], 2, ids[i], options.rank < links[i].peer ? 0 : 1, &config);
    if (result != ncclSuccess && result != ncclInProgress && error.ok()) {
      error = WithPrefix(NcclError("ncclCommInitRankConfig", result, comms[i]),
                         absl::StrCat(LinkName(links[i]), ": "));
    }
  }
  result = ncclGroupEnd();
  if (result != ncclSuccess && result != ncclInProgress && error.ok()) {
    error = NcclError("ncclGroupEnd (creating the link communicators)", result, nullptr);
  }
  std::vector<bool> joined(n, false);
  absl::Duration pause = absl::Microseconds(100);
  while (error.ok()) {
    std::vector<std::string> pending;
    for (size_t i = 0; i < n && error.ok(); ++i) {
      if (joined[i]) continue;
      if (comms[i] == nullptr) {
        error = absl::InternalError(
            absl::StrCat(LinkName(links[i]), ": ncclCommInitRankConfig returned no communicator"));
        break;
      }
      absl::StatusOr<bool> ready = CommReady(comms[i], "ncclCommInitRankConfig (asynchronous)");
      if (!ready.ok()) {
        error = WithPrefix(ready.status(), absl::StrCat(LinkName(links[i]), ": "));
      } else if (*ready) {
        joined[i] = true;
      } else {
        pending.push_back(LinkName(links[i]));
      }
    }
    if (!error.ok() || pending.empty()) break;
    if (absl::Now() >= deadline) {
      error = absl::DeadlineExceededError(absl::StrFormat(
          "the NCCL communicators of %s were not joined by their peers within %s",
          absl::StrJoin(pending, ", "), absl::FormatDuration(options.connect_timeout)));
      break;
    }
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Milliseconds(10));
  }
  if (!error.ok()) {
    for (ncclComm_t comm : comms) {
      if (comm != nullptr) ncclCommAbort(comm);
    }
    return error;
  }
  return comms;
}

absl::StatusOr<std::unique_ptr<Transport>> Create(const NcclOptions& options,
                                                  RendezvousStore* store) {
  const absl::Time deadline = absl::Now() + options.connect_timeout;
  RETURN_IF_ERROR(CheckCudaDevice(options.cuda_device));
  DeviceGuard guard(options.cuda_device);
  if (!guard.status().ok()) return guard.status();
  ASSIGN_OR_RETURN(ncclComm_t comm, JoinCommunicator(options, store, deadline));

  // comms[0] is the world's, then one per link.
  std::vector<ncclComm_t> comms = {comm};
  if (!options.links.empty()) {
    absl::StatusOr<std::vector<ncclComm_t>> link_comms = CreateLinkComms(options, store, deadline);
    if (!link_comms.ok()) {
      ncclCommAbort(comm);
      return link_comms.status();
    }
    comms.insert(comms.end(), link_comms->begin(), link_comms->end());
  }
  std::vector<cudaStream_t> streams;
  auto fail = [&](absl::Status status) {
    for (ncclComm_t c : comms) ncclCommAbort(c);
    for (cudaStream_t s : streams) cudaStreamDestroy(s);
    return status;
  };
  for (size_t i = 0; i < comms.size(); ++i) {
    cudaStream_t stream = nullptr;
    const cudaError_t error = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (error != cudaSuccess) return fail(CudaError("cudaStreamCreateWithFlags", error));
    streams.push_back(stream);
  }
  // The barrier's int. Stream-ordered where supported, so that freeing it never waits for the
  // whole device.
  int pools = 0;
  if (cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, options.cuda_device) !=
      cudaSuccess) {
    cudaGetLastError();
    pools = 0;
  }
  void* barrier_buffer = nullptr;
  cudaError_t error = pools != 0 ? cudaMallocAsync(&barrier_buffer, sizeof(int), streams[0])
                                 : cudaMalloc(&barrier_buffer, sizeof(int));
  if (error == cudaSuccess) error = cudaMemsetAsync(barrier_buffer, 0, sizeof(int), streams[0]);
  if (error != cudaSuccess) {
    return fail(CudaError(pools != 0 ? "cudaMallocAsync" : "cudaMalloc", error));
  }

  std::vector<std::unique_ptr<Channel>> channels;
  channels.push_back(
      std::make_unique<Channel>("world communicator", 0, -1, -1, comms[0], streams[0]));
  for (size_t i = 0; i < options.links.size(); ++i) {
    const NcclLink& link = options.links[i];
    channels.push_back(std::make_unique<Channel>(LinkName(link), link.link, link.peer,
                                                 options.rank < link.peer ? 1 : 0, comms[i + 1],
                                                 streams[i + 1]));
  }
  auto endpoint = std::make_shared<nccl_internal::Endpoint>(
      options, std::move(channels), static_cast<int*>(barrier_buffer), pools != 0);
  endpoint->Start();
  return std::unique_ptr<Transport>(
      new adapter::EndpointTransport<nccl_internal::Endpoint, nccl_internal::Op>(
          NcclDescriptor(), std::move(endpoint)));
}

// INVALID_ARGUMENT when `links` or `link_shift` is unusable.
absl::Status ValidateLinks(const NcclOptions& options) {
  if (options.link_shift < 0 || options.link_shift >= 64) {
    return absl::InvalidArgumentError(
        absl::StrFormat("link_shift %d is not in [0, 64)", options.link_shift));
  }
  std::set<std::pair<uint64_t, int>> seen;
  for (size_t i = 0; i < options.links.size(); ++i) {
    const NcclLink& link = options.links[i];
    const std::string name = absl::StrFormat("links[%d] (%s)", i, LinkName(link));
    if (link.peer == options.rank) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": the peer is this rank"));
    }
    if (link.peer < 0 || link.peer >= options.world_size) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: the peer is not in [0, %d)", name, options.world_size));
    }
    if (options.link_shift > 0 && (link.link >> (64 - options.link_shift)) != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: no tag has this link (tag >> %d); is it a tag?", name, options.link_shift));
    }
    if (!seen.insert({link.link, link.peer}).second) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": listed twice"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> CreateNcclTransport(const NcclOptions& options,
                                                               RendezvousStore* store) {
  RETURN_IF_ERROR(ValidateConnectOptions("CreateNcclTransport", options, store));
  if (absl::Status links = ValidateLinks(options); !links.ok()) {
    return WithPrefix(links, absl::StrFormat("CreateNcclTransport: rank %d: ", options.rank));
  }
  absl::StatusOr<std::unique_ptr<Transport>> transport = Create(options, store);
  if (!transport.ok()) {
    return WithPrefix(transport.status(),
                      absl::StrFormat("rank %d (cuda:%d): ", options.rank, options.cuda_device));
  }
  return transport;
}

bool NcclBuilt() { return true; }

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

bool NcclAvailable() { return CudaDeviceCount() > 0; }

}  // namespace stagecoach::transport
