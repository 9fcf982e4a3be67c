// The worker's side of the backend registry: each backend of common/transport/backends.h this
// build can create, with its factory and a check of whether this process can run it. The
// worker's service asks it which backends to offer at registration and creates the one a task
// names; what differs between backends is read from their capabilities, never from their names.
//
// TransportRegistry::Global() holds the built-in factories (Gloo always; NCCL, whose factory is
// unavailable in builds without NCCL or without a CUDA device), attached to
// BackendRegistry::Global(). A test may register the factory of a fake backend.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/transport/backends.h"
#include "worker/transport/connect_options.h"
#include "worker/transport/rendezvous_store.h"
#include "worker/transport/transport.h"

namespace stagecoach::transport {

// Everything a backend's factory may need to connect one rank; each uses what concerns it.
struct ConnectRequest {
  // Rank, world size, timeout, and this job attempt's key prefix (a backend may add to it).
  ConnectOptions options;
  // The address peers reach this worker at (backends that connect over TCP bind it).
  std::string hostname = "127.0.0.1";
  // The worker's CUDA device ordinal, -1 on a CPU worker.
  int cuda_device = -1;
  // The links the rank uses, for backends whose transfers are ordered per link
  // (BackendCapabilities::matches_tags false); the others ignore them.
  std::vector<Link> links;
  // The link of a tag is tag >> link_shift.
  int link_shift = 28;
};

using CreateTransportFn = std::function<absl::StatusOr<std::unique_ptr<Transport>>(
    const ConnectRequest& request, RendezvousStore* store)>;

struct BackendFactory {
  // A backend registered in the BackendRegistry the TransportRegistry was made with.
  std::string name;
  // Whether this process can create the backend (built in, its runtime present); null means
  // always. A backend that needs CUDA is offered only on a CUDA device besides.
  std::function<bool()> available;
  // Blocks until connected or failed, as the backend's factory.h says. Required.
  CreateTransportFn create;
};

// Factories by backend name. Thread-safe: one mutex guards the table; neither an availability
// check nor a factory runs under it.
class TransportRegistry {
 public:
  // `backends` must outlive the registry.
  explicit TransportRegistry(const BackendRegistry* backends);
  TransportRegistry(const TransportRegistry&) = delete;
  TransportRegistry& operator=(const TransportRegistry&) = delete;

  // The process's registry: the built-in factories over BackendRegistry::Global().
  static TransportRegistry& Global();

  // NOT_FOUND when factory.name is not a registered backend, INVALID_ARGUMENT without a
  // create function, ALREADY_EXISTS when the name has a factory.
  absl::Status Register(BackendFactory factory);

  // Removes a factory (a test's fake). NOT_FOUND when there is none by that name.
  absl::Status Unregister(absl::string_view name);

  // The backends a worker on `cuda_device` (-1: none) offers, sorted by name: those whose
  // factory is available and, when they need CUDA, only with a CUDA device.
  std::vector<std::string> Offered(int cuda_device) const;

  // The descriptor of backend `name` when a worker on `cuda_device` offers it; else
  // INVALID_ARGUMENT "transport: this worker offers gloo, not 'nccl'".
  absl::StatusOr<BackendDescriptor> FindOffered(absl::string_view name, int cuda_device) const;

  // Creates backend `name`'s transport on request.cuda_device: FindOffered's error, or the
  // factory's.
  absl::StatusOr<std::unique_ptr<Transport>> Create(absl::string_view name,
                                                    const ConnectRequest& request,
                                                    RendezvousStore* store) const;

 private:
  // The factories a worker on `cuda_device` offers, with their descriptors, by name.
  std::vector<std::pair<BackendDescriptor, BackendFactory>> OfferedFactories(int cuda_device) const;
  // Backend `name`'s entry among them; FindOffered's error when it is not one.
  absl::StatusOr<std::pair<BackendDescriptor, BackendFactory>> FindFactory(absl::string_view name,
                                                                           int cuda_device) const;

  const BackendRegistry* const backends_;
  mutable absl::Mutex mu_;
  std::map<std::string, BackendFactory, std::less<>> factories_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stagecoach::transport
