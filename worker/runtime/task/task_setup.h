// Task setup: everything a task builds from its TaskAssignment before it touches the data
// plane. The rank's stages of the model (a TorchScript graph split or a built-in family), moved
// to the task's device; the optimizer over their parameters; the resumed checkpoint's state;
// the parsed action list; an Infer job's batch, checked on stage 0 (so that a batch that does
// not fit fails on this rank, as the root cause, rather than as a broken connection on its
// peers); and the data plane's request.
//
// Errors name the field of the assignment or spec that is wrong (INVALID_ARGUMENT,
// FAILED_PRECONDITION for a worker or file that does not match the job). Functions here are
// stateless and thread-compatible; the objects they return are the task thread's, except
// TaskStages, which a client step's check may share (see TaskRunner).
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "common/schedule/action.h"
#include "common/spec/job_spec.h"
#include "stagecoach/v1/types.pb.h"
#include "worker/model/precision.h"
#include "worker/model/stage_model.h"
#include "worker/model/torchscript_model.h"
#include "worker/runtime/checkpoint/state_file.h"
#include "worker/runtime/data/training_data.h"
#include "worker/runtime/executor/message_tags.h"
#include "worker/runtime/executor/training_setup.h"
#include "worker/runtime/sharding/zero_shards.h"
#include "worker/runtime/task/task_runner.h"

namespace stagecoach::runtime {

// The rank's stages. Not thread-safe: one user at a time (the task's thread, or a client
// step's check while the task holds).
struct TaskStages {
  // The TorchScript model the stages are cut from; declared first so that it outlives them.
  std::unique_ptr<model::TorchScriptModel> script;
  std::vector<std::unique_ptr<model::StageModel>> owned;
  // Stage index -> this rank's stage.
  std::map<int, model::StageModel*> by_index;
  // How values flow between all stages of the pipeline.
  model::PipelineWiring wiring;
  // Parameter elements this rank holds (ReportStepRequest.parameters).
  int64_t held_parameters = 0;
  // Where the stages run and in which precision (for the work that runs on them while the task
  // holds: a client step's check, a generation session's decoding).
  torch::Device device = torch::kCPU;
  model::Precision precision = model::Precision::kFp32;
  // With placement.shard: parameters and replicas: by stage, its parameters (empty between
  // uses) and their shapes, for the checks that run a stage while the task holds.
  std::map<int, ParameterShapes> sharded;

  bool Owns(int stage) const { return by_index.count(stage) > 0; }
};

struct TaskSetup {
  spec::JobSpec spec;
  LossKind loss = LossKind::kMse;
  // training.precision.
  model::Precision precision = model::Precision::kFp32;
  torch::Device device = torch::kCPU;
  // Shared with a client step's check of stage 0 (TaskRunner::ControlTask).
  std::shared_ptr<TaskStages> stages;
  // Producer -> consumer stage pairs that are not adjacent (skip connections).
  std::vector<SkipPair> skips;
  // With placement.shard and replicas (ZeRO 1 to 3): the shards the optimizer steps instead of
  // the stages' parameters; else null.
  std::unique_ptr<ZeroShards> shards;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  // Global steps done when the task starts: the resumed checkpoint's step, else 0.
  int64_t base_step = 0;
  std::vector<schedule::Action> actions;
  // TaskAssignment.forward_only, or an Infer job's task.
  bool forward_only = false;
  // An Infer job's task (TaskAssignment.inference).
  bool inference = false;
  // An Infer job on the rank owning stage 0: the client's batch, split into microbatches.
  std::vector<torch::Tensor> inference_inputs;
};

// Builds the task's setup. `deps` gives the worker's device and the file resolver.
absl::StatusOr<TaskSetup> SetUpTask(const v1::TaskAssignment& task, const TaskRunnerDeps& deps);

// A resumed task starts from its checkpoint (TaskAssignment.resume), read from `files` (its
// directory, or an in-memory snapshot's files): parameters, buffers, optimizer state
// (forward-only tasks, inference on a checkpoint, take the weights only). Returns the
// timeline's position (which is also the data stream's): resume.step, or 0 without a resume.
absl::StatusOr<int64_t> Resume(const v1::TaskAssignment& task, TaskSetup& setup,
                               const StateFiles& files);

// What the task asks of its data plane: the pipeline transport of its replica.
TransportRequest DataPlaneRequest(const v1::TaskAssignment& task, const TaskSetup& setup);

// The task's replica (TaskAssignment.replica, replicas; 0 replicas is read as 1).
ReplicaShare ShareOf(const v1::TaskAssignment& task);

// The task's data-parallel group (the replicas' tasks of the same rank), when it has one: more
// than one replica and a backward.
std::optional<CollectivesRequest> DataParallelRequest(const v1::TaskAssignment& task,
                                                      const TaskSetup& setup);

}  // namespace stagecoach::runtime
