#include "bench/fleet/fake_fleet.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace stagecoach::bench {
namespace {

// Fake i listens (as far as the coordinator knows) at 127.10.(i / kPerOctet).(i % kPerOctet + 1).
constexpr int kPerOctet = 200;
constexpr int kMaxFakes = kPerOctet * 256;
constexpr int kMaxMessageBytes = 64 << 20;

std::chrono::system_clock::time_point Deadline(absl::Duration timeout) {
  return absl::ToChronoTime(absl::Now() + timeout);
}

grpc::Status Refused(grpc::StatusCode code, const std::string& why) {
  return grpc::Status(code, why);
}

}  // namespace

struct FakeFleet::Fake {
  std::string id;      // empty until registered
  std::string token;   // RegisterWorkerResponse.session_token
  std::string job_id;  // the task it holds; empty when idle
  int attempt = 0;
  int rank = -1;
  int replica = 0;
};

// The WorkerService of every fake: routes each call by its :authority and checks its token.
class FakeFleet::Service final : public v1::WorkerService::Service {
 public:
  explicit Service(FakeFleet* fleet) : fleet_(fleet) {}

  grpc::Status StartTask(grpc::ServerContext* ctx, const v1::StartTaskRequest* req,
                         v1::StartTaskResponse*) override {
    const v1::TaskAssignment& task = req->assignment();
    return WithFake(ctx, [&](Fake& fake, FleetCounters& counters) {
      if (!fake.job_id.empty() && fake.job_id != task.job_id()) {
        return Refused(grpc::StatusCode::FAILED_PRECONDITION,
                       absl::StrCat("fake ", fake.id, " runs a task of ", fake.job_id));
      }
      fake.job_id = task.job_id();
      fake.attempt = task.attempt();
      fake.rank = task.rank();
      fake.replica = task.replica();
      ++counters.start_tasks;
      return grpc::Status::OK;
    });
  }

  grpc::Status StopTask(grpc::ServerContext* ctx, const v1::StopTaskRequest* req,
                        v1::StopTaskResponse*) override {
    return WithFake(ctx, [&](Fake& fake, FleetCounters& counters) {
      if (fake.job_id == req->job_id()) fake.job_id.clear();
      ++counters.stop_tasks;
      return grpc::Status::OK;
    });
  }

  grpc::Status GetWorkerStatus(grpc::ServerContext* ctx, const v1::GetWorkerStatusRequest*,
                               v1::GetWorkerStatusResponse* resp) override {
    return WithFake(ctx, [&](Fake& fake, FleetCounters&) {
      resp->set_worker_id(fake.id);
      resp->set_job_id(fake.job_id);
      resp->set_rank(fake.job_id.empty() ? -1 : fake.rank);
      return grpc::Status::OK;
    });
  }

  grpc::Status ControlTask(grpc::ServerContext* ctx, const v1::ControlTaskRequest* req,
                           v1::ControlTaskResponse* resp) override {
    return WithFake(ctx, [&](Fake& fake, FleetCounters&) {
      if (fake.job_id != req->job_id() || fake.attempt != req->attempt()) {
        return Refused(grpc::StatusCode::FAILED_PRECONDITION, "no task of that job and attempt");
      }
      resp->set_global_steps_done(0);
      return grpc::Status::OK;
    });
  }

  grpc::Status RequestCheckpoint(grpc::ServerContext* ctx, const v1::RequestCheckpointRequest* req,
                                 v1::RequestCheckpointResponse*) override {
    return WithFake(ctx, [&](Fake& fake, FleetCounters&) {
      if (fake.job_id != req->job_id()) {
        return Refused(grpc::StatusCode::FAILED_PRECONDITION, "no task of that job");
      }
      return grpc::Status::OK;
    });
  }

  grpc::Status InspectModel(grpc::ServerContext*, const v1::InspectModelRequest*,
                            v1::InspectModelResponse*) override {
    return Refused(grpc::StatusCode::UNIMPLEMENTED, "a fake worker of fleet_bench loads no model");
  }

  grpc::Status Decode(grpc::ServerContext*, const v1::DecodeRequest*,
                      v1::DecodeResponse*) override {
    return Refused(grpc::StatusCode::UNIMPLEMENTED, "a fake worker of fleet_bench decodes nothing");
  }

 private:
  // Runs `body` on the fake the call is for, under the fleet's lock; UNAUTHENTICATED when the
  // call carries no fake's address or not its session token.
  template <typename Body>
  grpc::Status WithFake(grpc::ServerContext* ctx, Body body) {
    const int i = fleet_->FakeIndex(absl::string_view(ctx->ExperimentalGetAuthority().data(),
                                                      ctx->ExperimentalGetAuthority().size()));
    std::string bearer;
    const auto& metadata = ctx->client_metadata();
    if (auto it = metadata.find("authorization"); it != metadata.end()) {
      bearer.assign(it->second.data(), it->second.size());
    }
    absl::MutexLock lock(&fleet_->mu_);
    if (i < 0 || fleet_->fakes_[i].id.empty() ||
        bearer != absl::StrCat("Bearer ", fleet_->fakes_[i].token)) {
      ++fleet_->counters_.refused_calls;
      return Refused(grpc::StatusCode::UNAUTHENTICATED, "not a registered fake's call");
    }
    return body(fleet_->fakes_[i], fleet_->counters_);
  }

  FakeFleet* const fleet_;
};

FakeFleet::FakeFleet(const FakeFleetOptions& options) : options_(options) {
  absl::MutexLock lock(&mu_);
  fakes_.resize(options.workers);
}

absl::StatusOr<std::unique_ptr<FakeFleet>> FakeFleet::Start(const FakeFleetOptions& options) {
  if (options.workers < 1 || options.workers > kMaxFakes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--workers: ", options.workers, " given, 1 to ", kMaxFakes, " allowed"));
  }
  if (options.channels < 1 || options.register_threads < 1 || options.heartbeat_threads < 1) {
    return absl::InvalidArgumentError("channels and threads must be at least 1");
  }
  std::unique_ptr<FakeFleet> fleet(new FakeFleet(options));
  fleet->service_ = std::make_unique<Service>(fleet.get());
  grpc::ServerBuilder builder;
  // Every interface, so that 127.10.x.y reaches it (a socket bound to 127.0.0.1 would not).
  builder.AddListeningPort("0.0.0.0:0", grpc::InsecureServerCredentials(), &fleet->port_);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.RegisterService(fleet->service_.get());
  fleet->server_ = builder.BuildAndStart();
  if (fleet->server_ == nullptr || fleet->port_ == 0) {
    return absl::InternalError("the fakes' WorkerService could not listen on 0.0.0.0:0");
  }
  for (int c = 0; c <= options.channels; ++c) {  // the last one is the client's
    grpc::ChannelArguments args;
    // A pool of its own: otherwise channels to one target share one connection.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetMaxReceiveMessageSize(kMaxMessageBytes);
    auto stub = v1::CoordinatorService::NewStub(
        grpc::CreateCustomChannel(options.coordinator, grpc::InsecureChannelCredentials(), args));
    if (c < options.channels) {
      fleet->stubs_.push_back(std::move(stub));
    } else {
      fleet->client_ = std::move(stub);
    }
  }
  return fleet;
}

FakeFleet::~FakeFleet() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : heartbeaters_) t.join();
  {
    absl::MutexLock lock(&mu_);
    auto drained = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return in_flight_ == 0; };
    mu_.AwaitWithTimeout(absl::Condition(&drained), options_.rpc_timeout + absl::Seconds(1));
  }
  if (server_ != nullptr) server_->Shutdown(Deadline(absl::Seconds(2)));
}

std::string FakeFleet::Address(int i) const {
  return absl::StrCat("127.10.", i / kPerOctet, ".", i % kPerOctet + 1, ":", port_);
}

int FakeFleet::FakeIndex(absl::string_view authority) const {
  const std::vector<absl::string_view> parts = absl::StrSplit(authority, absl::ByAnyChar(".:"));
  int octets[4];
  int port = 0;
  if (parts.size() != 5 || !absl::SimpleAtoi(parts[4], &port) || port != port_) return -1;
  for (int k = 0; k < 4; ++k) {
    if (!absl::SimpleAtoi(parts[k], &octets[k])) return -1;
  }
  if (octets[0] != 127 || octets[1] != 10 || octets[3] < 1 || octets[3] > kPerOctet) return -1;
  const int i = octets[2] * kPerOctet + octets[3] - 1;
  return i < options_.workers ? i : -1;
}

absl::Status FakeFleet::RegisterOne(int i, Latencies& latencies) {
  v1::RegisterWorkerRequest req;
  req.set_name(absl::StrCat("fake-", i));
  req.set_address(Address(i));
  req.set_device("cpu");
  req.add_transports("gloo");
  v1::RegisterWorkerResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline(options_.rpc_timeout));
  const absl::Time start = absl::Now();
  const grpc::Status status = stub(i)->RegisterWorker(&ctx, req, &resp);
  latencies.Add(absl::Now() - start);
  if (!status.ok()) {
    return absl::UnavailableError(
        absl::StrCat("RegisterWorker of fake ", i, ": ", status.error_message()));
  }
  absl::MutexLock lock(&mu_);
  fakes_[i].id = resp.worker_id();
  fakes_[i].token = resp.session_token();
  interval_ = absl::Seconds(resp.heartbeat_interval().seconds()) +
              absl::Nanoseconds(resp.heartbeat_interval().nanos());
  return absl::OkStatus();
}

absl::StatusOr<Latencies> FakeFleet::RegisterAll() {
  Latencies all;
  // The first one tells the heartbeat interval; then the heartbeats start and the others
  // register concurrently (each fake heartbeats from its first round after registering).
  if (absl::Status first = RegisterOne(0, all); !first.ok()) return first;
  for (int t = 0; t < options_.heartbeat_threads; ++t) {
    heartbeaters_.emplace_back([this, t] { HeartbeatLoop(t); });
  }
  std::atomic<int> next{1};
  std::vector<Latencies> per_thread(options_.register_threads);
  std::vector<absl::Status> errors(options_.register_threads);
  std::vector<std::thread> threads;
  for (int t = 0; t < options_.register_threads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = next++; i < options_.workers && errors[t].ok(); i = next++) {
        errors[t] = RegisterOne(i, per_thread[t]);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < options_.register_threads; ++t) {
    if (!errors[t].ok()) return errors[t];
    all.Append(per_thread[t]);
  }
  return all;
}

bool FakeFleet::SleepUntil(absl::Time due) {
  absl::MutexLock lock(&mu_);
  auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
  return mu_.AwaitWithTimeout(absl::Condition(&stopping), due - absl::Now());
}

void FakeFleet::HeartbeatLoop(int thread) {
  absl::Time round = absl::Now();
  while (true) {
    absl::Duration interval;
    {
      absl::MutexLock lock(&mu_);
      interval = interval_;
    }
    for (int i = thread; i < options_.workers; i += options_.heartbeat_threads) {
      if (SleepUntil(round + interval * i / options_.workers)) return;
      SendHeartbeat(i);
    }
    round += interval;
    // Fallen a whole round behind (an overloaded machine): start the next one now.
    if (absl::Now() - round > interval) round = absl::Now();
  }
}

void FakeFleet::SendHeartbeat(int i) {
  struct Call {
    grpc::ClientContext ctx;
    v1::HeartbeatRequest req;
    v1::HeartbeatResponse resp;
    absl::Time start;
  };
  auto* call = new Call;
  {
    absl::MutexLock lock(&mu_);
    const Fake& fake = fakes_[i];
    if (fake.id.empty() || stopping_) {
      delete call;
      return;
    }
    call->req.set_worker_id(fake.id);
    call->req.set_session_token(fake.token);
    if (!fake.job_id.empty()) {
      call->req.set_job_id(fake.job_id);
    }
    if (!fake.job_id.empty() && options_.send_progress) {
      v1::RankProgress* progress = call->req.mutable_progress();
      progress->set_job_id(fake.job_id);
      progress->set_attempt(fake.attempt);
      progress->set_rank(fake.rank);
      progress->set_replica(fake.replica);
      progress->set_phase(v1::RANK_PHASE_SETUP);
    }
    ++in_flight_;
  }
  call->ctx.set_deadline(Deadline(options_.rpc_timeout));
  call->start = absl::Now();
  stub(i)->async()->Heartbeat(&call->ctx, &call->req, &call->resp, [this, call](grpc::Status s) {
    const absl::Duration took = absl::Now() - call->start;
    delete call;
    absl::MutexLock lock(&mu_);
    ++(s.ok() ? counters_.heartbeats_ok : counters_.heartbeats_failed);
    if (recording_) heartbeat_latencies_.Add(took);
    --in_flight_;
  });
}

absl::Status FakeFleet::EndTasks(const std::string& job_id) {
  std::vector<v1::ReportTaskEndRequest> ends;
  {
    absl::MutexLock lock(&mu_);
    for (Fake& fake : fakes_) {
      if (fake.job_id != job_id) continue;
      v1::ReportTaskEndRequest& req = ends.emplace_back();
      req.set_worker_id(fake.id);
      req.set_job_id(job_id);
      req.set_attempt(fake.attempt);
      req.set_rank(fake.rank);
      req.set_replica(fake.replica);
      req.set_outcome(v1::TASK_OUTCOME_SUCCEEDED);
      fake.job_id.clear();
    }
  }
  for (const v1::ReportTaskEndRequest& req : ends) {
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline(options_.rpc_timeout));
    v1::ReportTaskEndResponse resp;
    const grpc::Status status = stub(req.rank())->ReportTaskEnd(&ctx, req, &resp);
    if (!status.ok()) {
      return absl::UnavailableError(absl::StrCat("ReportTaskEnd of ", job_id, " rank ", req.rank(),
                                                 ": ", status.error_message()));
    }
  }
  return absl::OkStatus();
}

void FakeFleet::RecordHeartbeats(bool on) {
  absl::MutexLock lock(&mu_);
  recording_ = on;
}

Latencies FakeFleet::TakeHeartbeatLatencies() {
  absl::MutexLock lock(&mu_);
  Latencies out = std::move(heartbeat_latencies_);
  heartbeat_latencies_ = Latencies();
  return out;
}

FleetCounters FakeFleet::Counters() const {
  absl::MutexLock lock(&mu_);
  FleetCounters out = counters_;
  out.busy = static_cast<int>(
      std::count_if(fakes_.begin(), fakes_.end(), [](const Fake& f) { return !f.job_id.empty(); }));
  return out;
}

}  // namespace stagecoach::bench
