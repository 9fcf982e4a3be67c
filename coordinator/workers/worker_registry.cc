#include "coordinator/workers/worker_registry.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/time_conversion.h"
#include "common/transport/backends.h"

namespace stagecoach::coordinator {

void WorkerRecord::ToProto(v1::WorkerInfo* out) const {
  out->set_id(id);
  out->set_name(name);
  out->set_address(address);
  out->set_state(state);
  out->set_job_id(job_id);
  out->set_rank(rank);
  out->set_device(device);
  for (const auto& t : transports) out->add_transports(t);
  *out->mutable_last_heartbeat_time() = rpc::ToProtoTimestamp(last_heartbeat);
  out->set_reason(reason);
  out->set_reserved_for_job(reserved_for);
}

bool DeviceMatches(const std::string& placement_device, const std::string& worker_device) {
  if (placement_device == "cpu") return worker_device == "cpu";
  if (placement_device == "cuda") return absl::StartsWith(worker_device, "cuda");
  return placement_device == worker_device;
}

absl::StatusOr<std::string> WorkerRegistry::Register(const std::string& name,
                                                     const std::string& address,
                                                     const std::string& device,
                                                     const std::vector<std::string>& transports,
                                                     absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (auto at = by_address_.find(address); at != by_address_.end()) {
    const WorkerRecord& old = workers_.at(at->second);
    if (old.state != v1::WORKER_STATE_LOST) {
      return absl::AlreadyExistsError(
          absl::StrCat("worker ", old.id, " is already registered at ", address));
    }
    by_id_.erase(old.id);
    workers_.erase(at->second);
    by_address_.erase(at);
  }
  const int64_t n = next_id_++;
  WorkerRecord& w = workers_[n];
  w.id = absl::StrCat("w-", n);
  w.name = name.empty() ? address : name;
  w.address = address;
  w.device = device;
  w.transports = transports;
  w.state = v1::WORKER_STATE_IDLE;
  w.last_heartbeat = now;
  by_id_[w.id] = n;
  by_address_[address] = n;
  return w.id;
}

void WorkerRegistry::SetSessionToken(const std::string& id, const std::string& token) {
  absl::MutexLock lock(&mu_);
  if (WorkerRecord* w = MutableLocked(id); w != nullptr) w->session_token = token;
}

absl::Status WorkerRegistry::Heartbeat(const std::string& id, absl::Time now,
                                       const std::string& session_token) {
  absl::MutexLock lock(&mu_);
  WorkerRecord* w = MutableLocked(id);
  if (w == nullptr || w->state == v1::WORKER_STATE_LOST) {
    return absl::NotFoundError(absl::StrCat("worker ", id, " is not registered",
                                            w ? absl::StrCat(" (lost: ", w->reason, ")") : "",
                                            "; register again"));
  }
  if (!w->session_token.empty() && session_token != w->session_token) {
    return absl::NotFoundError(absl::StrCat("worker ", id, " is registered by another process (",
                                            w->name, " at ", w->address, "); register again"));
  }
  w->last_heartbeat = now;
  return absl::OkStatus();
}

std::vector<std::string> WorkerRegistry::ExpireLeases(absl::Time now) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> expired;
  for (auto& [n, w] : workers_) {
    if (w.state == v1::WORKER_STATE_LOST) continue;
    if (now - w.last_heartbeat > lease_) {
      w.state = v1::WORKER_STATE_LOST;
      w.reserved_for.clear();
      w.reason = absl::StrCat(
          "no heartbeat for ",
          absl::FormatDuration(absl::Trunc(now - w.last_heartbeat, absl::Milliseconds(1))),
          " (lease ", absl::FormatDuration(lease_), ")");
      expired.push_back(w.id);
    }
  }
  return expired;
}

bool WorkerRegistry::MarkLost(const std::string& id, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  WorkerRecord* w = MutableLocked(id);
  if (w == nullptr || w->state == v1::WORKER_STATE_LOST) return false;
  w->state = v1::WORKER_STATE_LOST;
  w->reserved_for.clear();
  w->reason = reason;
  return true;
}

absl::Status WorkerRegistry::Assign(const std::string& id, const std::string& job_id, int rank) {
  absl::MutexLock lock(&mu_);
  WorkerRecord* w = MutableLocked(id);
  if (w == nullptr || w->state != v1::WORKER_STATE_IDLE) {
    return absl::FailedPreconditionError(absl::StrCat("worker ", id, " is not idle"));
  }
  w->state = v1::WORKER_STATE_BUSY;
  w->job_id = job_id;
  w->rank = rank;
  w->reserved_for.clear();
  return absl::OkStatus();
}

absl::Status WorkerRegistry::Reserve(const std::string& id, const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  WorkerRecord* w = MutableLocked(id);
  if (w == nullptr || w->state != v1::WORKER_STATE_IDLE ||
      (!w->reserved_for.empty() && w->reserved_for != job_id)) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", id, " is not free to be held as a spare for ", job_id));
  }
  w->reserved_for = job_id;
  return absl::OkStatus();
}

void WorkerRegistry::Unreserve(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  for (auto& [n, w] : workers_) {
    if (w.reserved_for == job_id) w.reserved_for.clear();
  }
}

void WorkerRegistry::Release(const std::string& id, const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  WorkerRecord* w = MutableLocked(id);
  if (w == nullptr || w->state != v1::WORKER_STATE_BUSY || w->job_id != job_id) return;
  w->state = v1::WORKER_STATE_IDLE;
  w->job_id.clear();
  w->rank = -1;
}

std::vector<WorkerRecord> WorkerRegistry::Idle(const std::string& placement_device,
                                               const std::string& transport,
                                               const std::string& for_job) const {
  // A worker that registered no transports offers the backends every worker has.
  const absl::StatusOr<transport::BackendDescriptor> backend =
      transport::BackendRegistry::Global().Find(transport);
  const bool on_every_worker = backend.ok() && backend->capabilities.on_every_worker;
  absl::MutexLock lock(&mu_);
  std::vector<WorkerRecord> out;
  for (const auto& [n, w] : workers_) {
    const bool offers = w.transports.empty() ? on_every_worker
                                             : std::find(w.transports.begin(), w.transports.end(),
                                                         transport) != w.transports.end();
    const bool free = w.reserved_for.empty() || w.reserved_for == for_job;
    if (w.state == v1::WORKER_STATE_IDLE && free && DeviceMatches(placement_device, w.device) &&
        offers) {
      out.push_back(w);
    }
  }
  // The job's own spares first: its restarts and healings take them before other free workers.
  std::stable_partition(out.begin(), out.end(), [&](const WorkerRecord& w) {
    return !for_job.empty() && w.reserved_for == for_job;
  });
  return out;
}

bool WorkerRegistry::AnyBusyWith(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [n, w] : workers_) {
    if (w.state == v1::WORKER_STATE_BUSY && w.job_id == job_id) return true;
  }
  return false;
}

std::optional<WorkerRecord> WorkerRegistry::Find(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  const WorkerRecord* w = FindLocked(id);
  if (w == nullptr) return std::nullopt;
  return *w;
}

const WorkerRecord* WorkerRegistry::FindLocked(const std::string& id) const {
  const auto n = by_id_.find(id);
  if (n == by_id_.end()) return nullptr;
  const auto it = workers_.find(n->second);
  return it == workers_.end() ? nullptr : &it->second;
}

WorkerRecord* WorkerRegistry::MutableLocked(const std::string& id) {
  return const_cast<WorkerRecord*>(FindLocked(id));
}

absl::Time WorkerRegistry::LastHeartbeat(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  const WorkerRecord* w = FindLocked(id);
  return w == nullptr ? absl::InfinitePast() : w->last_heartbeat;
}

std::map<v1::WorkerState, int> WorkerRegistry::Counts() const {
  absl::MutexLock lock(&mu_);
  std::map<v1::WorkerState, int> counts;
  for (const auto& [n, w] : workers_) ++counts[w.state];
  return counts;
}

std::vector<WorkerRecord> WorkerRegistry::All() const {
  absl::MutexLock lock(&mu_);
  std::vector<WorkerRecord> out;
  for (const auto& [n, w] : workers_) out.push_back(w);
  return out;
}

}  // namespace stagecoach::coordinator
