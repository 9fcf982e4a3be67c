#include "tests/support/local_cluster.h"

#include <signal.h>

#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/rpc/auth.h"
#include "common/rpc/channel.h"
#include "common/rpc/status_conversion.h"
#include "common/rpc/tls.h"
#include "tests/support/test_paths.h"

namespace stagecoach::testing {
namespace {

constexpr absl::Duration kStartTimeout = absl::Seconds(30);

// Reads the "listening on HOST:PORT" line a daemon prints first.
absl::StatusOr<std::string> ListeningAddress(ChildProcess& p) {
  auto line = p.ReadLine(kStartTimeout);
  if (!line.ok()) {
    return absl::Status(line.status().code(),
                        absl::StrCat(line.status().message(), "\n", p.StderrTail()));
  }
  absl::string_view rest = *line;
  if (!absl::ConsumePrefix(&rest, "listening on ")) {
    return absl::InternalError(absl::StrCat("unexpected first line: '", *line, "'"));
  }
  return std::string(rest);
}

}  // namespace

namespace {

// The daemons under a build's binary dir.
constexpr char kCoordinatorPath[] = "/coordinator/stagecoach-coordinator";
constexpr char kWorkerPath[] = "/worker/stagecoach-worker";

}  // namespace

std::string LocalCluster::DaemonBinary(const std::string& path) const {
  return (daemon_binary_dir_.empty() ? BinaryDir() : daemon_binary_dir_) + path;
}

std::string CoordinatorBinary() { return BinaryDir() + kCoordinatorPath; }
std::string WorkerBinary() { return BinaryDir() + kWorkerPath; }
std::string StagectlBinary() { return BinaryDir() + "/client/stagectl"; }

absl::StatusOr<std::string> ReadMetricsAddress(ChildProcess& daemon) {
  auto line = daemon.ReadLine(absl::Seconds(30));
  if (!line.ok()) return line.status();
  absl::string_view rest = *line;
  if (!absl::ConsumePrefix(&rest, "metrics on ")) {
    return absl::InternalError(absl::StrCat("expected 'metrics on HOST:PORT', got '", *line, "'"));
  }
  return std::string(rest);
}

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(const ClusterOptions& options) {
  std::unique_ptr<LocalCluster> c(new LocalCluster());
  c->daemon_binary_dir_ = options.daemon_binary_dir;
  c->launcher_ = options.launcher;
  c->worker_hosts_ = options.worker_hosts;
  if (!options.worker_hosts.empty() &&
      options.worker_hosts.size() < static_cast<size_t>(options.workers)) {
    return absl::InvalidArgumentError(absl::StrCat(options.workers, " workers but ",
                                                   options.worker_hosts.size(), " worker hosts"));
  }
  std::vector<std::string> coordinator_args = options.coordinator_host.launcher;
  coordinator_args.insert(coordinator_args.end(), c->launcher_.begin(), c->launcher_.end());
  coordinator_args.insert(coordinator_args.end(),
                          {c->DaemonBinary(kCoordinatorPath), "--listen",
                           absl::StrCat(options.coordinator_host.address, ":0")});
  for (const auto& [flag, value] : {std::pair{"--lease", options.lease},
                                    {"--heartbeat-interval", options.heartbeat_interval},
                                    {"--comm-timeout", options.comm_timeout},
                                    {"--log-level", options.log_level}}) {
    coordinator_args.insert(coordinator_args.end(), {flag, value});
  }
  // Flags of both daemons: the lock-order checks; TLS, and the same for the cluster's calls and
  // stagectl (the tokens follow).
  std::vector<std::string> daemon_args;
  if (options.check_lock_order) daemon_args.push_back("--debug-lock-order");
  if (!options.tls_ca.empty()) {
    daemon_args.insert(daemon_args.end(),
                       {"--tls-ca", options.tls_ca, "--tls-cert", options.tls_server_cert,
                        "--tls-key", options.tls_server_key});
    if (options.tls_require_client_cert) daemon_args.push_back("--tls-require-client-cert");
    c->stagectl_args_ = {"--tls-ca", options.tls_ca};
    if (!options.tls_client_cert.empty()) {
      c->stagectl_args_.insert(c->stagectl_args_.end(), {"--tls-cert", options.tls_client_cert,
                                                         "--tls-key", options.tls_client_key});
    }
  }
  coordinator_args.insert(coordinator_args.end(), daemon_args.begin(), daemon_args.end());
  c->worker_args_ = daemon_args;
  c->log_level_ = options.log_level;
  if (!options.client_token_file.empty()) {
    coordinator_args.insert(coordinator_args.end(),
                            {"--client-token-file", options.client_token_file});
    c->stagectl_args_.insert(c->stagectl_args_.end(), {"--token-file", options.client_token_file});
  }
  if (!options.worker_token_file.empty()) {
    coordinator_args.insert(coordinator_args.end(),
                            {"--worker-token-file", options.worker_token_file});
    c->worker_args_.insert(c->worker_args_.end(),
                           {"--coordinator-token-file", options.worker_token_file});
  }
  coordinator_args.insert(coordinator_args.end(), options.coordinator_args.begin(),
                          options.coordinator_args.end());
  auto coordinator = ChildProcess::Start(coordinator_args, c->dir() + "/coordinator.log");
  if (!coordinator.ok()) return coordinator.status();
  c->coordinator_ = *std::move(coordinator);
  c->coordinator_argv_ = coordinator_args;
  c->coordinator_starts_ = 1;
  auto address = ListeningAddress(*c->coordinator_);
  if (!address.ok()) return address.status();
  c->coordinator_address_ = *address;
  rpc::ChannelSecurity security;
  auto credentials = rpc::MakeChannelCredentials(
      {options.tls_client_cert, options.tls_client_key, options.tls_ca});
  if (!credentials.ok()) return credentials.status();
  security.credentials = *credentials;
  if (!options.client_token_file.empty()) {
    auto token = rpc::ReadTokenFile(options.client_token_file, "client_token_file");
    if (!token.ok()) return token.status();
    security.bearer_token = *token;
  }
  c->security_ = security;
  c->stub_ = v1::CoordinatorService::NewStub(rpc::MakeChannel(c->coordinator_address_, security));
  c->worker_args_.insert(c->worker_args_.end(), options.worker_args.begin(),
                         options.worker_args.end());
  for (int i = 0; i < options.workers; ++i) {
    auto added = c->AddWorker();
    if (!added.ok()) return added.status();
  }
  absl::Status idle = c->WaitForIdleWorkers(options.workers, kStartTimeout);
  if (!idle.ok()) return absl::Status(idle.code(), absl::StrCat(idle.message(), "\n", c->Logs()));
  return c;
}

LocalCluster::~LocalCluster() {
  for (auto& w : workers_) w->Stop();
  // The cluster's own channel goes first: an idle client connection that nobody polls never
  // reads the coordinator's GOAWAY, so its graceful shutdown would wait out its whole grace.
  stub_.reset();
  if (coordinator_) coordinator_->Stop();
}

absl::Status LocalCluster::RestartCoordinator() {
  coordinator_->Signal(SIGKILL);
  absl::StatusOr<int> exited = coordinator_->Wait(kStartTimeout);
  if (!exited.ok()) return exited.status();
  std::vector<std::string> argv = coordinator_argv_;
  for (size_t i = 0; i + 1 < argv.size(); ++i) {
    if (argv[i] == "--listen") argv[i + 1] = coordinator_address_;  // the same port again
  }
  ++coordinator_starts_;
  auto coordinator =
      ChildProcess::Start(argv, absl::StrCat(dir(), "/coordinator-", coordinator_starts_, ".log"));
  if (!coordinator.ok()) return coordinator.status();
  coordinator_ = *std::move(coordinator);
  auto address = ListeningAddress(*coordinator_);
  if (!address.ok()) return address.status();
  if (*address != coordinator_address_) {
    return absl::InternalError(absl::StrCat("restarted coordinator listens on ", *address,
                                            ", not on ", coordinator_address_));
  }
  // A fresh channel: the old one may be waiting out its reconnect backoff.
  stub_ = v1::CoordinatorService::NewStub(rpc::MakeChannel(coordinator_address_, security_));
  return absl::OkStatus();
}

absl::StatusOr<int> LocalCluster::AddWorker(const std::vector<std::string>& extra_args) {
  const int index = static_cast<int>(workers_.size());
  DaemonHost host;
  if (!worker_hosts_.empty()) {
    if (static_cast<size_t>(index) >= worker_hosts_.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker ", index, " has no host (", worker_hosts_.size(), " hosts)"));
    }
    host = worker_hosts_[index];
  }
  std::vector<std::string> args = host.launcher;
  args.insert(args.end(), launcher_.begin(), launcher_.end());
  args.insert(args.end(), {DaemonBinary(kWorkerPath), "--coordinator", coordinator_address_,
                           "--listen", absl::StrCat(host.address, ":0"), "--name",
                           absl::StrCat("worker-", index), "--log-level", log_level_});
  args.insert(args.end(), worker_args_.begin(), worker_args_.end());
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  auto worker = ChildProcess::Start(args, absl::StrCat(dir(), "/worker-", index, ".log"));
  if (!worker.ok()) return worker.status();
  auto address = ListeningAddress(**worker);
  if (!address.ok()) return address.status();
  workers_.push_back(*std::move(worker));
  worker_addresses_.push_back(*address);
  return index;
}

int LocalCluster::WorkerIndex(const std::string& worker_id) {
  auto workers = ListWorkers();
  if (!workers.ok()) return -1;
  for (const auto& w : *workers) {
    if (w.id() != worker_id) continue;
    for (size_t i = 0; i < worker_addresses_.size(); ++i) {
      if (worker_addresses_[i] == w.address()) return static_cast<int>(i);
    }
  }
  return -1;
}

absl::Status LocalCluster::WaitForIdleWorkers(int n, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  int idle = 0;
  while (absl::Now() < deadline) {
    auto workers = ListWorkers();
    idle = 0;
    if (workers.ok()) {
      for (const auto& w : *workers) idle += w.state() == v1::WORKER_STATE_IDLE;
      if (idle >= n) return absl::OkStatus();
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat("waited ", absl::FormatDuration(timeout), " for ",
                                                  n, " idle workers, have ", idle));
}

CommandResult LocalCluster::Stagectl(const std::vector<std::string>& args, absl::Duration timeout) {
  std::vector<std::string> argv = {StagectlBinary(), "--coordinator", coordinator_address_};
  argv.insert(argv.end(), stagectl_args_.begin(), stagectl_args_.end());
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv, timeout);
}

absl::StatusOr<v1::Job> LocalCluster::GetJob(const std::string& job_id) {
  grpc::ClientContext ctx;
  rpc::SetDeadline(&ctx, absl::Seconds(10));
  v1::GetJobRequest req;
  req.set_job_id(job_id);
  req.set_history_all(true);  // tests compare whole loss histories
  v1::GetJobResponse resp;
  grpc::Status status = stub_->GetJob(&ctx, req, &resp);
  if (!status.ok()) return rpc::FromGrpcStatus(status);
  return resp.job();
}

absl::StatusOr<std::string> LocalCluster::Submit(const std::string& spec_yaml, bool paused) {
  grpc::ClientContext ctx;
  rpc::SetDeadline(&ctx, absl::Seconds(30));
  v1::SubmitJobRequest req;
  req.set_spec_yaml(spec_yaml);
  req.set_start_paused(paused);
  v1::SubmitJobResponse resp;
  grpc::Status status = stub_->SubmitJob(&ctx, req, &resp);
  if (!status.ok()) return rpc::FromGrpcStatus(status);
  return resp.job_id();
}

absl::Status LocalCluster::Cancel(const std::string& job_id) {
  grpc::ClientContext ctx;
  rpc::SetDeadline(&ctx, absl::Seconds(30));
  v1::CancelJobRequest req;
  req.set_job_id(job_id);
  v1::CancelJobResponse resp;
  return rpc::FromGrpcStatus(stub_->CancelJob(&ctx, req, &resp));
}

absl::StatusOr<std::vector<v1::WorkerInfo>> LocalCluster::ListWorkers() {
  grpc::ClientContext ctx;
  rpc::SetDeadline(&ctx, absl::Seconds(10));
  v1::ListWorkersResponse resp;
  grpc::Status status = stub_->ListWorkers(&ctx, {}, &resp);
  if (!status.ok()) return rpc::FromGrpcStatus(status);
  return std::vector<v1::WorkerInfo>(resp.workers().begin(), resp.workers().end());
}

absl::StatusOr<v1::Job> LocalCluster::WaitForJob(const std::string& job_id,
                                                 const std::function<bool(const v1::Job&)>& done,
                                                 absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::StatusOr<v1::Job> job;
  while (absl::Now() < deadline) {
    job = GetJob(job_id);
    if (job.ok() && done(*job)) return job;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "waited ", absl::FormatDuration(timeout), " for ", job_id, "; last seen: ",
      job.ok() ? absl::StrCat(v1::JobState_Name(job->state()), " (", job->reason(), ")")
               : std::string(job.status().message())));
}

absl::StatusOr<v1::Job> LocalCluster::SubmitAndWait(const std::string& spec_yaml, bool paused,
                                                    v1::JobState state, absl::Duration timeout) {
  absl::StatusOr<std::string> id = Submit(spec_yaml, paused);
  if (!id.ok()) return id.status();
  return WaitForJob(
      *id,
      [state](const v1::Job& j) {
        return j.state() == state || j.state() == v1::JOB_STATE_SUCCEEDED ||
               j.state() == v1::JOB_STATE_FAILED || j.state() == v1::JOB_STATE_CANCELLED;
      },
      timeout);
}

std::string LocalCluster::WriteFile(const std::string& name, const std::string& text) {
  const std::string path = dir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

std::string LocalCluster::Logs() {
  std::string out;
  // Each process's stderr, headed by whether it still runs (and where its threads sleep) or
  // how it ended: a daemon that went silent shows whether it died or is stuck.
  if (coordinator_) {
    absl::StrAppend(&out, "--- coordinator (", coordinator_->Describe(), ") ---\n",
                    coordinator_->StderrTail());
  }
  for (size_t i = 0; i < workers_.size(); ++i) {
    absl::StrAppend(&out, "--- worker-", i, " (", workers_[i]->Describe(), ") ---\n",
                    workers_[i]->StderrTail());
  }
  return out;
}

}  // namespace stagecoach::testing
