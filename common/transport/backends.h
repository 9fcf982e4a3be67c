// Data-plane backends described by what they can do, so that the planner, the spec parser, the
// worker registry and the executor choose and check a backend by its capabilities instead of by
// its name. Torch-, Gloo- and CUDA-free: the coordinator links it. The worker attaches the
// factory of each backend to the same name (worker/transport/registry.h).
//
// BackendRegistry::Global() holds the built-in backends (GlooDescriptor, NcclDescriptor: the
// one place that names them). A test may register a fake backend and remove it again.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace stagecoach::transport {

// What a backend does beyond transport.h's common ground. Defaults are those of a host-memory
// backend that needs nothing.
struct BackendCapabilities {
  // Send and Recv take device memory on the worker's CUDA device: the executor hands the
  // transport its compute device's tensors. False: host memory (CUDA tensors cross through
  // host copies).
  bool takes_device_memory = false;
  // Transfers pair up by (peer, tag), whatever the order they were posted in. False: they pair
  // in posting order per channel, and the backend orders transfers per link (a kind of message
  // over one stage boundary with one peer): its factory is given the links the rank uses, and
  // both sides must post each link's transfers in the same order.
  bool matches_tags = true;
  // A byte-count mismatch between a send and its receive fails the receive ("expected N bytes
  // from rank p tag t, got M"). False: the behaviour is undefined.
  bool detects_size_mismatch = true;
  // Transport::RecvUpTo: a receive may take a send of fewer bytes than it was posted for (the
  // caller learns how many from elsewhere, e.g. a header sent ahead). False: RecvUpTo is
  // UNIMPLEMENTED and receives must be posted with the sent size.
  bool shorter_receives = false;
  // A transfer that is not matched yet delays no other transfer. False: one still waiting for
  // its peer may hold back later transfers on its channel.
  bool independent_transfers = true;
  // Runs only on a CUDA device: refused for placement.device cpu, offered only by workers that
  // run on a GPU.
  bool needs_cuda = false;
  // Every worker build has it and can run it on any device: a worker that registered no
  // transports is taken to offer it.
  bool on_every_worker = false;
};

struct BackendDescriptor {
  // The name specs (placement.transport), registrations and task assignments use: lowercase
  // letters, digits, '_' and '-'; never "auto".
  std::string name;
  BackendCapabilities capabilities;
  // Breaks ties between backends that suit a device equally well when placement.transport is
  // "auto" (BackendRegistry::DefaultFor): the higher wins. The built-in backends have 0.
  int auto_preference = 0;
};

// The built-in backends. Gloo: host memory over TCP, tags matched, on every worker. NCCL:
// device memory, transfers ordered per link, CUDA only.
const BackendDescriptor& GlooDescriptor();
const BackendDescriptor& NcclDescriptor();

// The placement device a backend with needs_cuda requires (placement.device).
inline constexpr absl::string_view kCudaDevice = "cuda";

// Backends by name. Thread-safe: one mutex guards the table, no call blocks on anything else.
class BackendRegistry {
 public:
  // An empty registry (tests); production code uses Global().
  BackendRegistry() = default;
  BackendRegistry(const BackendRegistry&) = delete;
  BackendRegistry& operator=(const BackendRegistry&) = delete;

  // The process's registry, holding the built-in backends. Never destroyed.
  static BackendRegistry& Global();

  // Adds a backend. INVALID_ARGUMENT for a malformed name (see BackendDescriptor::name) or
  // contradictory capabilities (device memory without needs_cuda; needs_cuda with
  // on_every_worker); ALREADY_EXISTS when the name is taken.
  absl::Status Register(BackendDescriptor descriptor);

  // Removes a backend (a test's fake). NOT_FOUND when it is not registered.
  absl::Status Unregister(absl::string_view name);

  // NOT_FOUND naming the registered backends when `name` is not one of them.
  absl::StatusOr<BackendDescriptor> Find(absl::string_view name) const;

  // The registered names, sorted.
  std::vector<std::string> Names() const;

  // The backend placement.transport "auto" means for placement device `device` ("cpu" or
  // "cuda"): among the backends usable there (those with needs_cuda only on cuda), first those
  // whose memory is the device's own (device memory on cuda, host memory elsewhere), then the
  // higher auto_preference, then the first name. NOT_FOUND when none is usable.
  absl::StatusOr<BackendDescriptor> DefaultFor(absl::string_view device) const;

  // Resolves placement.transport for placement device `device`: "" or "auto" gives
  // DefaultFor(device)'s name, a registered backend's name itself. INVALID_ARGUMENT, with a
  // message meant to follow the field's name: "must be one of auto, gloo, nccl, got 'mpi'",
  // or "nccl needs placement.device cuda (device is cpu; use gloo or auto)".
  absl::StatusOr<std::string> Resolve(absl::string_view transport, absl::string_view device) const;

  // Whether backend `transport` (or "auto") can serve placement device `device`;
  // INVALID_ARGUMENT as Resolve's second message for one that needs CUDA on another device.
  // OK for a name that is not registered (Resolve reports those).
  absl::Status CheckDevice(absl::string_view transport, absl::string_view device) const;

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, BackendDescriptor, std::less<>> backends_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stagecoach::transport
