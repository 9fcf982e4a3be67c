#include "worker/service/coordinator_session.h"

#include <algorithm>

#include "common/rpc/auth.h"
#include "common/rpc/time_conversion.h"
#include "common/util/logging.h"

namespace stagecoach::worker {

void SessionToken::Set(const std::string& token) {
  absl::MutexLock lock(&mu_);
  token_ = token;
}

absl::Status SessionToken::Check(const grpc::ServerContext& ctx) {
  std::string token;
  {
    absl::MutexLock lock(&mu_);
    auto registered = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !token_.empty(); };
    mu_.AwaitWithTimeout(absl::Condition(&registered), registration_grace_);
    token = token_;
  }
  if (token.empty()) {
    return absl::UnauthenticatedError(
        "call not from this worker's coordinator (missing or wrong session token): the worker "
        "is not registered yet");
  }
  return rpc::CheckBearer(
      ctx, token, "call not from this worker's coordinator (missing or wrong session token)");
}

CoordinatorSession::CoordinatorSession(SessionOptions options, CoordinatorClient* client,
                                       std::function<std::string()> current_job,
                                       std::function<void(const std::string&)> forgotten)
    : options_(std::move(options)),
      client_(client),
      current_job_(std::move(current_job)),
      forgotten_(std::move(forgotten)) {}

CoordinatorSession::~CoordinatorSession() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void CoordinatorSession::Start() {
  thread_ = std::thread([this] { Loop(); });
}

std::string CoordinatorSession::worker_id() {
  absl::MutexLock lock(&mu_);
  return worker_id_;
}

bool CoordinatorSession::WaitRegistered(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto registered = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !worker_id_.empty(); };
  return mu_.AwaitWithTimeout(absl::Condition(&registered), timeout);
}

void CoordinatorSession::Loop() {
  absl::Duration backoff = absl::Milliseconds(100);
  absl::Duration interval = absl::Seconds(1);
  int failures = 0;
  while (true) {
    std::string id = worker_id();
    absl::Duration pause;
    if (id.empty()) {
      auto registered = client_->Register(options_.registration);
      if (registered.ok()) {
        interval = std::max(rpc::FromProtoDuration(registered->heartbeat_interval()),
                            absl::Milliseconds(10));
        spdlog::info("registered with coordinator {} as {} (heartbeat every {})",
                     client_->address(), registered->worker_id(), absl::FormatDuration(interval));
        if (options_.token != nullptr) {
          if (registered->session_token().empty()) {
            spdlog::warn(
                "coordinator {} issued no session token: this worker refuses every "
                "WorkerService call until it does",
                client_->address());
          }
          options_.token->Set(registered->session_token());
        }
        absl::MutexLock lock(&mu_);
        worker_id_ = registered->worker_id();
        session_token_ = registered->session_token();
        backoff = absl::Milliseconds(100);
        failures = 0;
        pause = interval;
      } else {
        // Log the first failure and then every tenth, not every retry.
        if (failures++ % 10 == 0) {
          spdlog::warn("cannot register (retrying): {}", registered.status().message());
        }
        pause = backoff;
        backoff = std::min(backoff * 2, options_.max_backoff);
      }
    } else {
      std::string token;
      {
        absl::MutexLock lock(&mu_);
        token = session_token_;
      }
      v1::HeartbeatRequest request;
      request.set_worker_id(id);
      request.set_job_id(current_job_());
      request.set_session_token(token);
      if (options_.snapshots != nullptr) {
        for (std::string& job : options_.snapshots->Jobs()) request.add_snapshot_jobs(job);
      }
      if (options_.progress) {
        std::optional<v1::RankProgress> progress = options_.progress();
        if (progress.has_value()) *request.mutable_progress() = *std::move(progress);
      }
      absl::StatusOr<v1::HeartbeatResponse> answer = client_->Heartbeat(request);
      const absl::Status beat = answer.status();
      if (answer.ok() && options_.snapshots != nullptr) {
        for (const auto& [job, from_step] : answer->snapshot_keep_from()) {
          options_.snapshots->KeepFrom(job, from_step);
        }
      }
      if (absl::IsNotFound(beat)) {
        spdlog::warn("coordinator forgot this worker: {}", beat.message());
        if (options_.token != nullptr) options_.token->Set("");
        forgotten_(std::string(beat.message()));
        absl::MutexLock lock(&mu_);
        worker_id_.clear();
        pause = absl::ZeroDuration();
      } else {
        if (!beat.ok()) spdlog::warn("heartbeat: {}", beat.message());
        pause = interval;
      }
    }
    absl::MutexLock lock(&mu_);
    auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
    if (mu_.AwaitWithTimeout(absl::Condition(&stopping), pause)) return;
  }
}

}  // namespace stagecoach::worker
