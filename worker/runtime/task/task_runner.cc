#include "worker/runtime/task/task_runner.h"

#include <algorithm>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/checkpoint/layout.h"
#include "common/rpc/time_conversion.h"
#include "common/util/logging.h"
#include "common/util/status_macros.h"
#include "common/util/work_queue.h"
#include "worker/runtime/generation/decode_sessions.h"
#include "worker/runtime/snapshot/snapshot_restore.h"
#include "worker/runtime/snapshot/snapshot_steps.h"
#include "worker/runtime/task/checkpoint_steps.h"
#include "worker/runtime/task/client_steps.h"
#include "worker/runtime/task/data_steps.h"
#include "worker/runtime/task/step_reports.h"
#include "worker/runtime/task/task_setup.h"
#include "worker/runtime/task/tensor_data.h"
#include "worker/runtime/task/training_parts.h"
#include "worker/runtime/training/replica_sync.h"

namespace stagecoach::runtime {
namespace {

// The gate of `task` (see the file comment of task_runner.h for the assignment's part).
StepGateOptions GateOptions(const v1::TaskAssignment& task) {
  StepGateOptions options;
  options.job_id = task.job_id();
  options.attempt = task.attempt();
  options.rank = task.rank();
  options.steps_done = task.has_resume() ? task.resume().step() : 0;
  options.step_limit = task.step_limit();
  options.finish_at_limit = task.finish_at_limit();
  if (task.has_inference()) {
    // An Infer job runs its one step and ends, whatever the assignment's limit.
    options.step_limit = options.steps_done + 1;
    options.finish_at_limit = true;
  }
  options.checkpoint_steps.assign(task.checkpoint_steps().begin(), task.checkpoint_steps().end());
  options.hold_timeout = rpc::FromProtoDuration(task.hold_timeout());
  if (options.hold_timeout <= absl::ZeroDuration()) options.hold_timeout = absl::Hours(24);
  options.check_timeout = rpc::FromProtoDuration(task.comm_timeout());
  if (options.check_timeout <= absl::ZeroDuration()) options.check_timeout = absl::Seconds(60);
  options.forward_only_task = task.forward_only();
  return options;
}

}  // namespace

// Decorates the task's rendezvous store so that Stop can interrupt its waits: long waits are
// cut into short slices, and a cancelled store answers CANCELLED.
class TaskRunner::CancellableStore : public transport::RendezvousStore {
 public:
  static constexpr absl::Duration kSlice = absl::Milliseconds(250);

  explicit CancellableStore(transport::RendezvousStore* inner) : inner_(inner) {}

  void Cancel() { cancelled_.store(true); }

  absl::Status Set(const std::string& key, const std::string& value) override {
    if (cancelled_.load()) return Cancelled();
    return inner_->Set(key, value);
  }

  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      if (cancelled_.load()) return Cancelled();
      const absl::Duration slice =
          std::min(kSlice, std::max(deadline - absl::Now(), absl::ZeroDuration()));
      auto value = inner_->Get(key, slice);
      if (value.ok() || !absl::IsDeadlineExceeded(value.status()) || absl::Now() >= deadline) {
        return value;
      }
    }
  }

  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      if (cancelled_.load()) return Cancelled();
      const absl::Duration slice =
          std::min(kSlice, std::max(deadline - absl::Now(), absl::ZeroDuration()));
      absl::Status waited = inner_->Wait(keys, slice);
      if (waited.ok() || !absl::IsDeadlineExceeded(waited) || absl::Now() >= deadline) {
        return waited;
      }
    }
  }

 private:
  static absl::Status Cancelled() {
    return absl::CancelledError("rendezvous interrupted: the task is stopping");
  }

  transport::RendezvousStore* inner_;
  std::atomic<bool> cancelled_{false};
};

TaskRunner::TaskRunner(v1::TaskAssignment task, TaskRunnerDeps deps)
    : task_(std::move(task)),
      deps_(std::move(deps)),
      gate_(GateOptions(task_)),
      progress_(task_.job_id(), task_.attempt(), task_.rank(), task_.replica()),
      decode_sessions_(std::make_unique<DecodeSessions>()),
      store_(std::make_unique<CancellableStore>(deps_.store)) {}

TaskRunner::~TaskRunner() = default;

void TaskRunner::Stop(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  gate_.Stop(reason);
  store_->Cancel();
  if (transport_ != nullptr) transport_->Abort();
  if (group_ != nullptr) group_->Abort();
  if (snapshot_abort_ != nullptr) snapshot_abort_->Abort();
}

absl::Status TaskRunner::RequestCheckpoint(int64_t global_step) {
  return gate_.RequestCheckpoint(global_step);
}

absl::StatusOr<v1::ControlTaskResponse> TaskRunner::ControlTask(
    const v1::ControlTaskRequest& request) {
  if (request.job_id() != task_.job_id() || request.attempt() != task_.attempt()) {
    return absl::FailedPreconditionError(
        absl::StrCat("this task is ", task_.job_id(), " attempt ", task_.attempt(), " rank ",
                     task_.rank(), ", not ", request.job_id(), " attempt ", request.attempt()));
  }
  if (task_.has_inference()) {
    return absl::FailedPreconditionError(
        absl::StrCat(task_.job_id(), " attempt ", task_.attempt(), " rank ", task_.rank(),
                     ": an Infer job's task runs its one step and takes no ControlTask"));
  }
  // A client step's batch is checked and split before the gate sees it.
  std::optional<StepGate::ClientStep> client;
  StepGate::Check check;
  if (request.has_client_step()) {
    ASSIGN_OR_RETURN(client, DecodeClientStep(task_, request));
    check = Stage0Check(*client);
  }
  StepGate::Control control;
  control.step_limit = request.step_limit();
  control.finish_at_limit = request.finish_at_limit();
  control.checkpoint_steps.assign(request.checkpoint_steps().begin(),
                                  request.checkpoint_steps().end());
  ASSIGN_OR_RETURN(const int64_t done, gate_.Apply(control, std::move(client), check));
  v1::ControlTaskResponse response;
  response.set_global_steps_done(done);
  return response;
}

absl::StatusOr<v1::DecodeResponse> TaskRunner::Decode(const v1::DecodeRequest& request) {
  const std::string who =
      absl::StrCat(task_.job_id(), " attempt ", task_.attempt(), " rank ", task_.rank());
  if (request.job_id() != task_.job_id() || request.attempt() != task_.attempt()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this task is ", who, ", not ", request.job_id(), " attempt ", request.attempt()));
  }
  v1::DecodeResponse response;
  if (request.end_session()) {
    decode_sessions_->End(request.session());
    return response;
  }
  DecodeStepRequest step;
  step.session = request.session();
  step.stage = request.stage();
  step.session_rows = request.session_rows();
  step.max_positions = request.max_positions();
  step.rows.assign(request.rows().begin(), request.rows().end());
  step.starts.assign(request.starts().begin(), request.starts().end());
  step.last_position_only = request.last_position_only();
  ASSIGN_OR_RETURN(step.inputs, FromTensorData(request.inputs(), "inputs"));
  const std::string what =
      absl::StrCat("decoding step of session ", request.session(), " on stage ", request.stage());
  RETURN_IF_ERROR(gate_.RunHeld(
      [&]() -> absl::Status {
        std::shared_ptr<TaskStages> stages;
        {
          absl::MutexLock lock(&mu_);
          stages = held_stages_;
        }
        if (stages == nullptr || !stages->Owns(request.stage())) {
          return absl::FailedPreconditionError(
              absl::StrCat(who, " does not run stage ", request.stage(),
                           stages == nullptr ? " (it has no stages: set-up or its end)" : ""));
        }
        if (stages->sharded.count(request.stage()) > 0) {
          return absl::FailedPreconditionError(
              absl::StrCat(who, ": stage ", request.stage(),
                           " keeps its parameters sharded across the replicas between steps "
                           "(placement.shard: parameters); decode from a checkpoint instead"));
        }
        ASSIGN_OR_RETURN(DecodeStepResult result,
                         decode_sessions_->Run(step, *stages->by_index.at(request.stage()),
                                               stages->precision, stages->device));
        ASSIGN_OR_RETURN(*response.mutable_outputs(), ToTensorData(result.outputs));
        response.set_cache_bytes(result.cache_bytes);
        return absl::OkStatus();
      },
      what));
  return response;
}

StepGate::Check TaskRunner::Stage0Check(const StepGate::ClientStep& client) {
  const auto* batch = dynamic_cast<const ClientBatch*>(client.payload.get());
  const bool owns_first =
      std::any_of(task_.stages().begin(), task_.stages().end(),
                  [](const v1::StageAssignment& st) { return st.stage() == 0; });
  if (!owns_first || batch == nullptr) return nullptr;
  // The gate runs the check once the task's thread is at its step boundary, so after its set-up
  // (the stages are known by then). The batch lives in the client step, which the gate keeps
  // until the check has run; the stages are shared, so that they outlive the check if the task
  // ends meanwhile.
  return [this, batch]() -> absl::Status {
    std::shared_ptr<TaskStages> stages;
    {
      absl::MutexLock lock(&mu_);
      stages = held_stages_;
    }
    if (stages == nullptr || !stages->Owns(0)) {
      return absl::FailedPreconditionError(
          absl::StrCat(task_.job_id(), " attempt ", task_.attempt(), " rank ", task_.rank(),
                       ": the task has no stages to check the client step on (it is ending)"));
    }
    // Sharded parameters are empty between steps: the check runs on zeros of their shapes.
    auto sharded = stages->sharded.find(0);
    const absl::Cleanup empty_again = sharded != stages->sharded.end()
                                          ? FillEmptyWithZeros(sharded->second)
                                          : std::function<void()>([] {});
    return CheckStage0Takes(batch->inputs, *stages->by_index.at(0),
                            absl::StrCat("client_step.inputs (rank ", task_.rank(), ")"));
  };
}

v1::ReportTaskEndRequest TaskRunner::Run() {
  absl::Status status;
  try {
    status = RunSteps();
  } catch (const std::exception& e) {
    status = absl::InternalError(absl::StrCat("rank ", task_.rank(), ": ", e.what()));
  }
  gate_.Finish();
  decode_sessions_->Clear();
  v1::ReportTaskEndRequest end;
  end.set_worker_id(deps_.worker_id);
  end.set_job_id(task_.job_id());
  end.set_attempt(task_.attempt());
  end.set_rank(task_.rank());
  end.set_replica(task_.replica());
  const std::optional<std::string> stopped = gate_.stop_reason();
  if (status.ok()) {
    end.set_outcome(v1::TASK_OUTCOME_SUCCEEDED);
    if (inference_outputs_.has_value()) {
      *end.mutable_inference_outputs() = *std::move(inference_outputs_);
    }
  } else if (stopped.has_value()) {
    end.set_outcome(v1::TASK_OUTCOME_STOPPED);
    end.set_error(absl::StrCat("stopped: ", *stopped));
  } else {
    end.set_outcome(v1::TASK_OUTCOME_FAILED);
    end.set_error(std::string(status.message()));
  }
  if (end.outcome() == v1::TASK_OUTCOME_FAILED) {
    spdlog::error("{} rank {} failed: {}", task_.job_id(), task_.rank(), end.error());
  } else {
    spdlog::info("{} rank {} ended: {}", task_.job_id(), task_.rank(),
                 v1::TaskOutcome_Name(end.outcome()));
  }
  return end;
}

void TaskRunner::UseDataPlane(transport::Transport* transport, collectives::Collectives* group,
                              std::shared_ptr<TaskStages> stages) {
  absl::MutexLock lock(&mu_);
  transport_ = transport;
  group_ = group;
  held_stages_ = std::move(stages);
  if (gate_.stop_reason().has_value()) {
    if (transport_ != nullptr) transport_->Abort();
    if (group_ != nullptr) group_->Abort();
  }
}

absl::Status TaskRunner::RunSteps() {
  ASSIGN_OR_RETURN(TaskSetup setup, SetUpTask(task_, deps_));
  ASSIGN_OR_RETURN(std::unique_ptr<transport::Transport> transport,
                   deps_.make_transport(DataPlaneRequest(task_, setup), store_.get()));
  UseDataPlane(transport.get(), nullptr, setup.stages);
  const std::optional<CollectivesRequest> dp = DataParallelRequest(task_, setup);
  // A replacement makes its group when it joins (Regroup): the attempt's first group has moved
  // on.
  if (dp.has_value() && !task_.has_join()) {
    absl::StatusOr<std::unique_ptr<collectives::Collectives>> made =
        deps_.make_collectives
            ? deps_.make_collectives(*dp, store_.get())
            : absl::FailedPreconditionError("this worker cannot make data-parallel groups");
    if (!made.ok()) {
      UseDataPlane(nullptr, nullptr, nullptr);
      transport->Abort();
      return absl::Status(made.status().code(),
                          absl::StrCat("rank ", task_.rank(), " replica ", task_.replica(),
                                       ": data-parallel group: ", made.status().message()));
    }
    dp_group_ = *std::move(made);
    UseDataPlane(transport.get(), dp_group_.get(), setup.stages);
  }
  absl::Status status = ConnectSnapshots(setup);
  if (status.ok()) status = RunOnDataPlane(setup, *transport);
  if (!status.ok()) {
    transport->Abort();
    if (dp_group_ != nullptr) dp_group_->Abort();
    // A snapshot still exchanging is abandoned, not waited for.
    if (snapshot_transport_ != nullptr) snapshot_transport_->Abort();
  }
  snapshots_.reset();
  UseDataPlane(nullptr, nullptr, nullptr);
  {
    absl::MutexLock lock(&mu_);
    snapshot_abort_ = nullptr;
  }
  snapshot_transport_.reset();
  dp_group_.reset();
  return status;
}

absl::Status TaskRunner::ConnectSnapshots(TaskSetup& setup) {
  const int64_t every_steps = setup.forward_only ? 0 : setup.spec.training.snapshot.every_steps;
  const bool restoring = task_.resume().has_snapshot();
  if (every_steps <= 0 && !restoring) return absl::OkStatus();
  if (deps_.snapshot_store == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        task_.job_id(), " rank ", task_.rank(), ": this worker keeps no in-memory snapshots"));
  }
  // What an earlier attempt left after this one's start is not this attempt's state.
  deps_.snapshot_store->DropAfter(task_.job_id(), task_.has_resume() ? task_.resume().step() : 0);
  const absl::Duration timeout = rpc::FromProtoDuration(task_.comm_timeout());
  if (task_.world_size() > 1) {
    TransportRequest request;
    request.backend = "gloo";  // host memory: the snapshots are
    request.rank = task_.rank();
    request.world_size = task_.world_size();
    request.prefix = absl::StrCat(task_.rendezvous_prefix(), "snapshot/");
    request.timeout = timeout;
    absl::StatusOr<std::unique_ptr<transport::Transport>> made =
        deps_.make_transport(request, store_.get());
    if (!made.ok()) {
      return absl::Status(
          made.status().code(),
          absl::StrCat("rank ", task_.rank(), ": snapshot transport: ", made.status().message()));
    }
    snapshot_transport_ = *std::move(made);
    absl::MutexLock lock(&mu_);
    snapshot_abort_ = snapshot_transport_.get();
    if (gate_.stop_reason().has_value()) snapshot_abort_->Abort();
  }
  if (restoring) {
    const absl::Time start = absl::Now();
    ASSIGN_OR_RETURN(
        const StateFiles files,
        ExchangeSnapshotForRestore(task_, *deps_.snapshot_store, snapshot_transport_.get(),
                                   std::max(timeout, absl::Minutes(5))));
    ASSIGN_OR_RETURN(setup.base_step, Resume(task_, setup, files));
    spdlog::info("{} rank {}: restored from the in-memory snapshot after step {} in {}",
                 task_.job_id(), task_.rank(), setup.base_step,
                 absl::FormatDuration(absl::Now() - start));
  }
  if (every_steps > 0) {
    SnapshotStepsOptions options = SnapshotOptionsOf(task_, deps_.worker_id, every_steps);
    // The last stage's copy of tied embeddings is in stage 0's file, as in a checkpoint.
    const std::optional<TiedPair> tied = TiedPairOf(setup.spec, task_.num_stages());
    if (tied.has_value() && setup.stages->Owns(tied->second_stage)) {
      options.omitted[tied->second_stage] = tied->second_name;
    }
    snapshots_ = std::make_unique<SnapshotSteps>(std::move(options), setup.stages->by_index,
                                                 setup.optimizer.get(), deps_.snapshot_store,
                                                 snapshot_transport_.get(), deps_.report_snapshot);
    // A restored rank holds its own files again: the lost worker's copies are replaced (not
    // after a snapshot of another layout, restored by name: the next snapshot is this layout's).
    if (restoring && !task_.resume().by_name()) snapshots_->ReportHeld(setup.base_step);
  }
  return absl::OkStatus();
}

namespace {

// After an error on a connected data plane: aborts it, so that the peers fail promptly instead
// of waiting out their timeouts.
absl::Status AbortDataPlane(transport::Transport& transport, collectives::Collectives* group,
                            absl::Status status) {
  transport.Abort();
  if (group != nullptr) group->Abort();
  return status;
}

}  // namespace

absl::Status TaskRunner::Regroup(const MembershipChange& change, TaskSetup& setup,
                                 transport::Transport& transport, GradientReducer& reducer,
                                 CheckpointSteps& checkpoints) {
  std::optional<CollectivesRequest> request = DataParallelRequest(task_, setup);
  if (!request.has_value() || !deps_.make_collectives) {
    return absl::FailedPreconditionError("this task has no data-parallel group to re-form");
  }
  const int epoch = change.epoch;
  request->rank = change.group_rank;
  request->size = change.group_size;
  request->prefix = absl::StrCat(task_.rendezvous_prefix(), "dp/e", epoch, "/", task_.rank(), "/");
  absl::StatusOr<std::unique_ptr<collectives::Collectives>> made =
      deps_.make_collectives(*request, store_.get());
  if (!made.ok()) {
    return absl::Status(
        made.status().code(),
        absl::StrCat("rank ", task_.rank(), " replica ", task_.replica(),
                     ": data-parallel group of epoch ", epoch, ": ", made.status().message()));
  }
  if (dp_group_ != nullptr) dp_group_->Abort();
  reducer.SetGroup(made->get(), std::max(task_.replicas(), 1));
  UseDataPlane(&transport, made->get(), setup.stages);
  dp_group_ = *std::move(made);
  checkpoints.SetWriter(change.group_rank == 0);
  if (change.donor < 0) return absl::OkStatus();
  // A healed replica joins: every member takes the donor's state before the join step.
  absl::StatusOr<SyncStats> synced = SyncReplicaState(
      *dp_group_, change.donor, setup.stages->by_index, *setup.optimizer, setup.device,
      change.join_step, rpc::FromProtoDuration(task_.comm_timeout()));
  if (!synced.ok()) {
    dp_group_->Abort();
    return absl::Status(synced.status().code(),
                        absl::StrCat("rank ", task_.rank(), " replica ", task_.replica(),
                                     ": a healed replica's state: ", synced.status().message()));
  }
  spdlog::info("{} rank {} replica {}: {} the state of global step {} ({} bytes, {})",
               task_.job_id(), task_.rank(), task_.replica(),
               change.group_rank == change.donor ? "sent" : "received", change.join_step,
               synced->bytes, absl::FormatDuration(synced->took));
  return absl::OkStatus();
}

absl::Status TaskRunner::JoinRunningJob(ReplicaMembership& membership) {
  ASSIGN_OR_RETURN(const JoinPoint at, membership.Join());
  gate_.StartAt(at.global_step, at.step_limit, at.finish_at_limit);
  steps_done_.store(at.global_step - task_.join().attempt_base());
  spdlog::info("{} rank {} replica {}: joined at global step {}", task_.job_id(), task_.rank(),
               task_.replica(), at.global_step);
  return absl::OkStatus();
}

absl::Status TaskRunner::RunOnDataPlane(TaskSetup& setup, transport::Transport& transport) {
  collectives::Collectives* group = dp_group_.get();
  StepReports reports(task_, deps_.worker_id, setup.stages->held_parameters, &transport,
                      deps_.reporter);
  absl::StatusOr<TrainingParts> parts = MakeTrainingParts(task_, setup, transport, group);
  if (!parts.ok()) return AbortDataPlane(transport, group, parts.status());
  if (parts->job_reduction != nullptr) parts->job_reduction->set_progress(&progress_);
  if (parts->gathering != nullptr) parts->gathering->set_progress(&progress_);
  CheckpointStepsOptions checkpoint_options;
  checkpoint_options.dir = setup.forward_only ? "" : setup.spec.training.checkpoint.dir;
  checkpoint_options.every_steps = setup.spec.training.checkpoint.every_steps;
  checkpoint_options.rank = task_.rank();
  checkpoint_options.writer = task_.replica() == 0;
  checkpoint_options.digests = group != nullptr || task_.has_join();
  if (parts->tied != nullptr) checkpoint_options.omitted = parts->tied->Omitted();
  const auto& builtin = setup.spec.model.builtin;
  checkpoint_options.hf_export = builtin.has_value() && builtin->decoder.has_value();
  checkpoint_options.hf_part_bytes = checkpoint::kHfShardBytes;
  checkpoint_options.async = setup.spec.training.checkpoint.async;
  CheckpointSteps checkpoints(checkpoint_options, setup.stages->by_index, setup.optimizer.get(),
                              &reports, setup.shards.get(), parts->gathering.get());
  std::unique_ptr<StepRollback> rollback;
  std::unique_ptr<ReplicaMembership> membership;
  if (task_.settle_steps() && parts->reducer != nullptr) {
    if (!deps_.settle_step) {
      return AbortDataPlane(
          transport, group,
          absl::FailedPreconditionError("this worker cannot settle steps with the coordinator"));
    }
    rollback = std::make_unique<StepRollback>(setup.stages->by_index, setup.device);
    MembershipOptions options;
    options.worker_id = deps_.worker_id;
    options.job_id = task_.job_id();
    options.attempt = task_.attempt();
    options.rank = task_.rank();
    options.replica = task_.replica();
    options.replicas = std::max(task_.replicas(), 1);
    options.timeout = rpc::FromProtoDuration(task_.comm_timeout());
    if (options.timeout <= absl::ZeroDuration()) options.timeout = absl::Seconds(60);
    options.join_timeout = rpc::FromProtoDuration(task_.hold_timeout());
    if (options.join_timeout <= absl::ZeroDuration()) options.join_timeout = absl::Hours(24);
    membership = std::make_unique<ReplicaMembership>(
        options, deps_.settle_step,
        [this, &setup, &transport, reducer = parts->reducer.get(),
         &checkpoints](const MembershipChange& change) {
          return Regroup(change, setup, transport, *reducer, checkpoints);
        });
  }
  const StepEnv env{&task_,
                    &setup,
                    &transport,
                    &gate_,
                    &reports,
                    &checkpoints,
                    snapshots_.get(),
                    &steps_done_,
                    &inference_outputs_,
                    parts->reducer.get(),
                    parts->recipe.get(),
                    parts->tied.get(),
                    deps_.memory_counter,
                    membership.get(),
                    rollback.get(),
                    &progress_,
                    deps_.debug_slow_factor,
                    parts->gathering.get()};
  absl::StatusOr<std::unique_ptr<DataSteps>> data = DataSteps::Create(env);
  if (!data.ok()) return AbortDataPlane(transport, group, data.status());
  if (task_.has_join() && membership != nullptr) {
    const absl::Status joined = JoinRunningJob(*membership);
    if (!joined.ok()) return AbortDataPlane(transport, dp_group_.get(), joined);
  }
  ClientSteps client_steps(env, data->get());
  spdlog::info("{} rank {}: stages ready, {}{} actions, timeline at step {}", task_.job_id(),
               task_.rank(), setup.forward_only ? "forward-only, " : "", setup.actions.size(),
               setup.base_step);
  const absl::Status status = StepLoop(**data, client_steps, checkpoints);
  gate_.Finish();
  if (!status.ok()) return AbortDataPlane(transport, dp_group_.get(), status);
  // Every rank is done with the data plane before any tears it down.
  return transport.Barrier(rpc::FromProtoDuration(task_.comm_timeout()));
}

absl::Status TaskRunner::StepLoop(DataSteps& data, ClientSteps& client_steps,
                                  CheckpointSteps& checkpoints) {
  for (;;) {
    ASSIGN_OR_RETURN(const StepGate::Decision decision, gate_.Next());
    absl::Status status;
    switch (decision.action) {
      case StepGate::Action::kDataStep:
        status = data.RunDataStep(decision.steps_done);
        break;
      case StepGate::Action::kClientStep:
        status = client_steps.Run(decision.client, decision.steps_done);
        break;
      case StepGate::Action::kCheckpointAtHold:
        status = checkpoints.AtHold(decision.steps_done, steps_done_.load() - 1);
        break;
      case StepGate::Action::kFinish: {
        // The last checkpoint's files are reported before the task's end. A snapshot that
        // fails now costs nothing the checkpoint does not cover: it does not fail the task.
        absl::Status drained = checkpoints.Drain();
        if (snapshots_ != nullptr) {
          const absl::Status snapshot = snapshots_->Drain();
          if (!snapshot.ok()) {
            spdlog::warn("{} rank {}: the last in-memory snapshot: {}", task_.job_id(),
                         task_.rank(), snapshot.message());
          }
        }
        return drained;
      }
    }
    RETURN_IF_ERROR(status);
  }
}

}  // namespace stagecoach::runtime
