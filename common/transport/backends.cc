#include "common/transport/backends.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace stagecoach::transport {
namespace {

constexpr absl::string_view kAuto = "auto";

bool ValidName(absl::string_view name) {
  if (name.empty() || name == kAuto) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

bool UsableOn(const BackendDescriptor& backend, absl::string_view device) {
  return !backend.capabilities.needs_cuda || device == kCudaDevice;
}

// Whether the backend moves the device's own memory: device memory on cuda, host memory
// elsewhere.
bool Native(const BackendDescriptor& backend, absl::string_view device) {
  return backend.capabilities.takes_device_memory == (device == kCudaDevice);
}

}  // namespace

const BackendDescriptor& GlooDescriptor() {
  static const BackendDescriptor* const gloo = [] {
    auto* d = new BackendDescriptor;
    d->name = "gloo";
    d->capabilities.on_every_worker = true;
    d->capabilities.shorter_receives = true;
    return d;
  }();
  return *gloo;
}

const BackendDescriptor& NcclDescriptor() {
  static const BackendDescriptor* const nccl = [] {
    auto* d = new BackendDescriptor;
    d->name = "nccl";
    d->capabilities.takes_device_memory = true;
    d->capabilities.matches_tags = false;
    d->capabilities.detects_size_mismatch = false;
    d->capabilities.independent_transfers = false;
    d->capabilities.needs_cuda = true;
    return d;
  }();
  return *nccl;
}

BackendRegistry& BackendRegistry::Global() {
  static BackendRegistry* const registry = [] {
    auto* r = new BackendRegistry;
    for (const BackendDescriptor* builtin : {&GlooDescriptor(), &NcclDescriptor()}) {
      r->Register(*builtin).IgnoreError();  // Valid and distinct by construction.
    }
    return r;
  }();
  return *registry;
}

absl::Status BackendRegistry::Register(BackendDescriptor descriptor) {
  if (!ValidName(descriptor.name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("transport backend name '", descriptor.name,
                     "' must be lowercase letters, digits, '_' or '-', and not 'auto'"));
  }
  const BackendCapabilities& caps = descriptor.capabilities;
  if (caps.takes_device_memory && !caps.needs_cuda) {
    return absl::InvalidArgumentError(absl::StrCat("transport backend ", descriptor.name,
                                                   ": takes device memory, so it needs CUDA"));
  }
  if (caps.needs_cuda && caps.on_every_worker) {
    return absl::InvalidArgumentError(absl::StrCat("transport backend ", descriptor.name,
                                                   ": needs CUDA, so not every worker has it"));
  }
  absl::MutexLock lock(&mu_);
  const std::string name = descriptor.name;
  if (!backends_.emplace(name, std::move(descriptor)).second) {
    return absl::AlreadyExistsError(
        absl::StrCat("transport backend ", name, " is already registered"));
  }
  return absl::OkStatus();
}

absl::Status BackendRegistry::Unregister(absl::string_view name) {
  absl::MutexLock lock(&mu_);
  auto it = backends_.find(name);
  if (it == backends_.end()) {
    return absl::NotFoundError(absl::StrCat("transport backend ", name, " is not registered"));
  }
  backends_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<BackendDescriptor> BackendRegistry::Find(absl::string_view name) const {
  absl::MutexLock lock(&mu_);
  auto it = backends_.find(name);
  if (it != backends_.end()) return it->second;
  std::vector<std::string> names;
  for (const auto& [registered, backend] : backends_) names.push_back(registered);
  return absl::NotFoundError(absl::StrCat("no transport backend '", name,
                                          "' (registered: ", absl::StrJoin(names, ", "), ")"));
}

std::vector<std::string> BackendRegistry::Names() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> names;
  for (const auto& [name, backend] : backends_) names.push_back(name);
  return names;
}

absl::StatusOr<BackendDescriptor> BackendRegistry::DefaultFor(absl::string_view device) const {
  absl::MutexLock lock(&mu_);
  const BackendDescriptor* best = nullptr;
  // Sorted by name, so on a full tie the first one seen stays.
  auto rank = [&](const BackendDescriptor& b) {
    return std::make_tuple(Native(b, device), b.auto_preference);
  };
  for (const auto& [name, backend] : backends_) {
    if (!UsableOn(backend, device)) continue;
    if (best == nullptr || rank(backend) > rank(*best)) best = &backend;
  }
  if (best == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("no registered transport backend runs on placement device ", device));
  }
  return *best;
}

absl::Status BackendRegistry::CheckDevice(absl::string_view transport,
                                          absl::string_view device) const {
  if (transport.empty() || transport == kAuto) return absl::OkStatus();
  absl::StatusOr<BackendDescriptor> backend = Find(transport);
  if (!backend.ok() || UsableOn(*backend, device)) return absl::OkStatus();
  absl::StatusOr<BackendDescriptor> fallback = DefaultFor(device);
  return absl::InvalidArgumentError(absl::StrCat(
      transport, " needs placement.device ", kCudaDevice, " (device is ", device, "; use ",
      fallback.ok() ? absl::StrCat(fallback->name, " or ") : "", kAuto, ")"));
}

absl::StatusOr<std::string> BackendRegistry::Resolve(absl::string_view transport,
                                                     absl::string_view device) const {
  if (transport.empty() || transport == kAuto) {
    absl::StatusOr<BackendDescriptor> chosen = DefaultFor(device);
    if (!chosen.ok()) return absl::InvalidArgumentError(chosen.status().message());
    return chosen->name;
  }
  if (!Find(transport).ok()) {
    std::vector<std::string> choices = {std::string(kAuto)};
    for (std::string& name : Names()) choices.push_back(std::move(name));
    return absl::InvalidArgumentError(
        absl::StrCat("must be one of ", absl::StrJoin(choices, ", "), ", got '", transport, "'"));
  }
  if (absl::Status usable = CheckDevice(transport, device); !usable.ok()) return usable;
  return std::string(transport);
}

}  // namespace stagecoach::transport
