#include "worker/transport/registry.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/util/status_macros.h"
#include "worker/transport/gloo/factory.h"
#include "worker/transport/nccl/factory.h"

namespace stagecoach::transport {
namespace {

absl::StatusOr<std::unique_ptr<Transport>> CreateGloo(const ConnectRequest& request,
                                                      RendezvousStore* store) {
  GlooOptions options;
  static_cast<ConnectOptions&>(options) = request.options;
  options.hostname = request.hostname;
  return CreateGlooTransport(options, store);
}

absl::StatusOr<std::unique_ptr<Transport>> CreateNccl(const ConnectRequest& request,
                                                      RendezvousStore* store) {
  NcclOptions options;
  static_cast<ConnectOptions&>(options) = request.options;
  options.key_prefix = absl::StrCat(request.options.key_prefix, "nccl/");
  options.cuda_device = request.cuda_device;
  options.links = request.links;
  options.link_shift = request.link_shift;
  return CreateNcclTransport(options, store);
}

}  // namespace

TransportRegistry::TransportRegistry(const BackendRegistry* backends) : backends_(backends) {}

TransportRegistry& TransportRegistry::Global() {
  static TransportRegistry* const registry = [] {
    auto* r = new TransportRegistry(&BackendRegistry::Global());
    // Both names are built-in backends, registered once: these cannot fail.
    r->Register({GlooDescriptor().name, nullptr, CreateGloo}).IgnoreError();
    r->Register({NcclDescriptor().name, NcclAvailable, CreateNccl}).IgnoreError();
    return r;
  }();
  return *registry;
}

absl::Status TransportRegistry::Register(BackendFactory factory) {
  absl::StatusOr<BackendDescriptor> backend = backends_->Find(factory.name);
  if (!backend.ok()) return backend.status();
  if (factory.create == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("transport backend ", factory.name, ": the factory has no create function"));
  }
  absl::MutexLock lock(&mu_);
  const std::string name = factory.name;
  if (!factories_.emplace(name, std::move(factory)).second) {
    return absl::AlreadyExistsError(
        absl::StrCat("transport backend ", name, " already has a factory"));
  }
  return absl::OkStatus();
}

absl::Status TransportRegistry::Unregister(absl::string_view name) {
  absl::MutexLock lock(&mu_);
  auto it = factories_.find(name);
  if (it == factories_.end()) {
    return absl::NotFoundError(absl::StrCat("transport backend ", name, " has no factory"));
  }
  factories_.erase(it);
  return absl::OkStatus();
}

std::vector<std::pair<BackendDescriptor, BackendFactory>> TransportRegistry::OfferedFactories(
    int cuda_device) const {
  std::vector<BackendFactory> factories;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, factory] : factories_) factories.push_back(factory);
  }
  std::vector<std::pair<BackendDescriptor, BackendFactory>> offered;
  for (BackendFactory& factory : factories) {
    // A backend unregistered since its factory was added is no longer offered.
    absl::StatusOr<BackendDescriptor> backend = backends_->Find(factory.name);
    if (!backend.ok()) continue;
    if (backend->capabilities.needs_cuda && cuda_device < 0) continue;
    if (factory.available != nullptr && !factory.available()) continue;
    offered.emplace_back(*std::move(backend), std::move(factory));
  }
  return offered;
}

std::vector<std::string> TransportRegistry::Offered(int cuda_device) const {
  std::vector<std::string> names;
  for (const auto& [backend, factory] : OfferedFactories(cuda_device)) {
    names.push_back(backend.name);
  }
  return names;
}

absl::StatusOr<std::pair<BackendDescriptor, BackendFactory>> TransportRegistry::FindFactory(
    absl::string_view name, int cuda_device) const {
  std::vector<std::pair<BackendDescriptor, BackendFactory>> offered = OfferedFactories(cuda_device);
  std::vector<std::string> names;
  for (auto& entry : offered) {
    if (entry.first.name == name) return std::move(entry);
    names.push_back(entry.first.name);
  }
  return absl::InvalidArgumentError(absl::StrCat("transport: this worker offers ",
                                                 absl::StrJoin(names, ", "), ", not '", name, "'"));
}

absl::StatusOr<BackendDescriptor> TransportRegistry::FindOffered(absl::string_view name,
                                                                 int cuda_device) const {
  ASSIGN_OR_RETURN(auto found, FindFactory(name, cuda_device));
  return std::move(found.first);
}

absl::StatusOr<std::unique_ptr<Transport>> TransportRegistry::Create(absl::string_view name,
                                                                     const ConnectRequest& request,
                                                                     RendezvousStore* store) const {
  ASSIGN_OR_RETURN(auto found, FindFactory(name, request.cuda_device));
  return found.second.create(request, store);
}

}  // namespace stagecoach::transport
