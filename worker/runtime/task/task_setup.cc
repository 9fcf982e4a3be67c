#include "worker/runtime/task/task_setup.h"

#include <torch/torch.h>

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/rpc/time_conversion.h"
#include "common/spec/hf_model_spec.h"
#include "common/spec/spec_parser.h"
#include "common/util/logging.h"
#include "common/util/status_macros.h"
#include "worker/model/builtin_stage.h"
#include "worker/runtime/checkpoint/checkpoint.h"
#include "worker/runtime/device/device.h"
#include "worker/runtime/sharding/zero_shards.h"
#include "worker/runtime/task/client_steps.h"
#include "worker/runtime/training/resume_by_name.h"
#include "worker/runtime/training/tied_parameters.h"

namespace stagecoach::runtime {
namespace {

// Where the stages run: the worker's CUDA device for placement.device cuda, else the CPU.
absl::StatusOr<torch::Device> TaskDevice(const spec::JobSpec& spec, const TaskRunnerDeps& deps) {
  if (spec.placement.device != "cuda") return torch::Device(torch::kCPU);
  if (CudaIndex(deps.device) < 0) {
    return absl::FailedPreconditionError(absl::StrCat("placement.device: cuda, but worker ",
                                                      deps.worker_id, " runs on ", deps.device,
                                                      " (start it with --device cuda)"));
  }
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(CudaIndex(deps.device)));
}

// A file the spec names (`field`): an uploaded artifact is fetched from the coordinator.
absl::StatusOr<std::string> Resolve(const TaskRunnerDeps& deps, const std::string& field,
                                    const std::string& ref) {
  if (!deps.resolve_file) return ref;
  auto path = deps.resolve_file(ref);
  if (!path.ok()) {
    return absl::Status(path.status().code(), absl::StrCat(field, ": ", path.status().message()));
  }
  return path;
}

// The rank's stages cut from model.torchscript (its graph split decides the wiring).
absl::Status BuildTorchScriptStages(const v1::TaskAssignment& task, const spec::JobSpec& spec,
                                    const TaskRunnerDeps& deps, TaskStages& out) {
  const int num_stages = task.num_stages();
  ASSIGN_OR_RETURN(const std::string path,
                   Resolve(deps, "model.torchscript", *spec.model.torchscript));
  // The planned layers name the nested modules whose calls the plan opened.
  const std::vector<std::string> planned(task.layer_names().begin(), task.layer_names().end());
  ASSIGN_OR_RETURN(out.script, model::TorchScriptModel::Load(path, "model.torchscript", planned));
  std::vector<std::string> names;
  for (const model::ModelLayer& layer : out.script->layers()) names.push_back(layer.name);
  if (!planned.empty() && planned != names) {
    return absl::FailedPreconditionError(
        absl::StrCat("model.torchscript: '", *spec.model.torchscript, "' has the layers [",
                     absl::StrJoin(names, ", "), "], but the job was planned with [",
                     absl::StrJoin(planned, ", "), "] (was the file replaced?)"));
  }
  std::vector<int> firsts(task.stage_first_layers().begin(), task.stage_first_layers().end());
  if (firsts.empty() && num_stages == 1) firsts = {0};
  if (static_cast<int>(firsts.size()) != num_stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage_first_layers: expected ", num_stages, " entries, got ", firsts.size()));
  }
  ASSIGN_OR_RETURN(out.wiring, out.script->Split(firsts));
  std::vector<int> mine;
  for (const v1::StageAssignment& st : task.stages()) mine.push_back(st.stage());
  RETURN_IF_ERROR(out.script->KeepOnlyStages(mine));
  for (int s : mine) {
    ASSIGN_OR_RETURN(auto stage, out.script->Stage(s));
    out.by_index[s] = stage.get();
    out.owned.push_back(std::move(stage));
  }
  return absl::OkStatus();
}

// The rank's stages of a built-in model (a chain).
absl::Status BuildBuiltinStages(const v1::TaskAssignment& task, const spec::BuiltinModel& builtin,
                                TaskStages& out) {
  for (const v1::StageAssignment& st : task.stages()) {
    ASSIGN_OR_RETURN(auto stage,
                     model::BuildBuiltinStage(builtin, st.first_layer(), st.end_layer()));
    out.by_index[st.stage()] = stage.get();
    out.owned.push_back(std::move(stage));
  }
  return absl::OkStatus();
}

// The rank's stages of the model, on `device`, and how values flow between all stages.
absl::StatusOr<std::shared_ptr<TaskStages>> BuildStages(const v1::TaskAssignment& task,
                                                        const spec::JobSpec& spec,
                                                        const TaskRunnerDeps& deps,
                                                        const torch::Device& device) {
  const int num_stages = task.num_stages();
  for (const v1::StageAssignment& st : task.stages()) {
    if (st.stage() < 0 || st.stage() >= num_stages ||
        task.stage_to_rank(st.stage()) != task.rank()) {
      return absl::InvalidArgumentError(
          absl::StrCat("stages: stage ", st.stage(), " is not assigned to rank ", task.rank()));
    }
  }
  if (task.stages().empty()) return absl::InvalidArgumentError("stages: the task has no stage");
  auto out = std::make_shared<TaskStages>();
  out->wiring = model::ChainWiring(num_stages);
  if (spec.model.torchscript.has_value()) {
    RETURN_IF_ERROR(BuildTorchScriptStages(task, spec, deps, *out));
  } else if (spec.model.builtin.has_value()) {
    RETURN_IF_ERROR(BuildBuiltinStages(task, *spec.model.builtin, *out));
  } else {
    return absl::InvalidArgumentError("model: neither a TorchScript nor a built-in model");
  }
  for (auto& [s, stage] : out->by_index) {
    stage->To(device);
    out->held_parameters += stage->ParameterCount();
  }
  if (out->script != nullptr) out->held_parameters = out->script->HeldParameterCount();
  return out;
}

// Skip connections: value pairs between stages that are not neighbours.
std::vector<SkipPair> SkipPairs(const model::PipelineWiring& wiring) {
  std::vector<SkipPair> skips;
  for (int c = 0; c < static_cast<int>(wiring.size()); ++c) {
    for (const model::ValueSource& src : wiring[c].inputs) {
      if (src.stage < 0 || src.stage == c - 1) continue;
      const bool known = std::any_of(skips.begin(), skips.end(), [&](const SkipPair& p) {
        return p.producer == src.stage && p.consumer == c;
      });
      if (!known) skips.push_back(SkipPair{src.stage, c});
    }
  }
  return skips;
}

}  // namespace

absl::StatusOr<int64_t> Resume(const v1::TaskAssignment& task, TaskSetup& setup,
                               const StateFiles& files) {
  if (!task.has_resume()) return 0;
  const v1::ResumeTask& resume = task.resume();
  const std::optional<TiedPair> tied = TiedPairOf(setup.spec, task.num_stages());
  if (resume.by_name()) {
    RETURN_IF_ERROR(RestoreStagesByName(resume, files, setup.stages->by_index, tied,
                                        setup.forward_only ? nullptr : setup.optimizer.get(),
                                        setup.shards.get()));
    spdlog::info("{} rank {}: resumed from {} (step {}), written on another layout", task.job_id(),
                 task.rank(), files.name(), resume.step());
    return resume.step();
  }
  for (auto& [s, stage] : setup.stages->by_index) {
    ASSIGN_OR_RETURN(const v1::StageCheckpointFile file, FindStageStateFile(resume, s));
    const bool sharded_files = std::any_of(
        resume.files().begin(), resume.files().end(), [s = s](const v1::StageCheckpointFile& f) {
          return f.stage() == s && f.file() != StageStateFileName(s) &&
                 f.file() != StageExportFileName(s);
        });
    // A tied copy is not in its stage's file: it comes from the first stage's (tied_parameters.h).
    std::vector<std::pair<std::string, torch::Tensor>> params = stage->NamedParameters();
    std::optional<std::pair<std::string, torch::Tensor>> copy;
    if (tied.has_value() && s == tied->second_stage) {
      auto it = std::find_if(params.begin(), params.end(),
                             [&](const auto& p) { return p.first == tied->second_name; });
      if (it != params.end()) {
        copy = *it;
        params.erase(it);
      }
    }
    const std::vector<std::pair<std::string, torch::Tensor>> buffers = stage->NamedBuffers();
    if (setup.forward_only) {
      RETURN_IF_ERROR(RestoreStageParameters(files, file, s, params, buffers));
    } else if (setup.shards != nullptr || sharded_files) {
      // Optimizer state of another layout (ZeRO-1 shards, or sharding now): re-laid out.
      RETURN_IF_ERROR(RestoreStageParameters(resume.directory(), file, s, params, buffers));
      RETURN_IF_ERROR(RestoreOptimizerState(resume, s, params, setup.spec.training.optimizer,
                                            *setup.optimizer, setup.shards.get()));
    } else {
      RETURN_IF_ERROR(RestoreStageCheckpoint(files, file, s, params, *setup.optimizer, buffers));
    }
    if (copy.has_value()) {
      RETURN_IF_ERROR(RestoreTiedCopy(*tied, resume, files, s, *copy,
                                      setup.forward_only ? nullptr : setup.optimizer.get()));
    }
  }
  if (setup.shards != nullptr) setup.shards->LoadShards();
  spdlog::info("{} rank {}: resumed from {} (step {})", task.job_id(), task.rank(), files.name(),
               resume.step());
  return resume.step();
}

namespace {

absl::StatusOr<std::vector<schedule::Action>> ParseActions(const v1::TaskAssignment& task) {
  std::vector<schedule::Action> actions;
  for (int i = 0; i < task.actions_size(); ++i) {
    auto action = schedule::ParseRequiredAction(task.actions(i));
    if (!action.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("actions[", i, "]: ", action.status().message()));
    }
    actions.push_back(*std::move(action));
  }
  return actions;
}

}  // namespace

absl::StatusOr<TaskSetup> SetUpTask(const v1::TaskAssignment& task, const TaskRunnerDeps& deps) {
  TaskSetup setup;
  ASSIGN_OR_RETURN(setup.spec, spec::ReadJobSpec(task.spec_yaml(), task.job_id()));
  ASSIGN_OR_RETURN(setup.loss, ParseLoss(setup.spec.training.loss));
  ASSIGN_OR_RETURN(setup.precision, model::ParsePrecision(setup.spec.training.precision));
  setup.forward_only = task.forward_only() || task.has_inference();
  setup.inference = task.has_inference();
  if (task.stage_to_rank_size() != task.num_stages()) {
    return absl::InvalidArgumentError(absl::StrCat("stage_to_rank: expected ", task.num_stages(),
                                                   " entries, got ", task.stage_to_rank_size()));
  }
  ASSIGN_OR_RETURN(setup.device, TaskDevice(setup.spec, deps));
  if (!setup.inference && !setup.spec.data.path.empty()) {
    ASSIGN_OR_RETURN(setup.spec.data.path, Resolve(deps, "data.path", setup.spec.data.path));
  }
  ASSIGN_OR_RETURN(setup.stages, BuildStages(task, setup.spec, deps, setup.device));
  setup.stages->device = setup.device;
  setup.stages->precision = setup.precision;
  setup.skips = SkipPairs(setup.stages->wiring);
  std::vector<torch::Tensor> parameters;
  const ReplicaShare share = ShareOf(task);
  if (setup.spec.placement.shards() && share.replicas > 1 && !setup.forward_only) {
    // ZeRO: the optimizer steps this replica's shards of the stages' flat parameters.
    ASSIGN_OR_RETURN(setup.shards, ZeroShards::Create(setup.stages->by_index, share.replica,
                                                      share.replicas, setup.spec.placement.shard));
    parameters = setup.shards->ShardParameters();
    if (setup.shards->level() == spec::ShardLevel::kParameters) {
      for (int s : setup.shards->stages()) setup.stages->sharded[s] = setup.shards->ShapesOf(s);
    }
  } else {
    for (auto& [s, stage] : setup.stages->by_index) {
      for (auto& p : stage->Parameters()) parameters.push_back(p);
    }
  }
  ASSIGN_OR_RETURN(setup.optimizer, MakeOptimizer(setup.spec.training.optimizer, parameters));
  // An in-memory snapshot's files come over the data plane: the runner resumes once it has them
  // (snapshot/snapshot_restore.h).
  if (!task.resume().has_snapshot()) {
    ASSIGN_OR_RETURN(setup.base_step, Resume(task, setup, task.resume().directory()));
  }
  ASSIGN_OR_RETURN(setup.actions, ParseActions(task));
  if (setup.inference && setup.stages->Owns(0)) {
    if (!task.inference().has_inputs()) {
      return absl::InvalidArgumentError("inference.inputs: required on the rank owning stage 0");
    }
    ASSIGN_OR_RETURN(
        setup.inference_inputs,
        InferenceMicrobatches(task.inference().inputs(), setup.spec.schedule.microbatches,
                              ShareOf(task), *setup.stages->by_index.at(0)));
  }
  return setup;
}

ReplicaShare ShareOf(const v1::TaskAssignment& task) {
  return ReplicaShare{task.replica(), std::max(1, task.replicas())};
}

std::optional<CollectivesRequest> DataParallelRequest(const v1::TaskAssignment& task,
                                                      const TaskSetup& setup) {
  const ReplicaShare share = ShareOf(task);
  if (share.replicas <= 1 || setup.forward_only) return std::nullopt;
  CollectivesRequest request;
  request.backend = task.transport();
  request.rank = share.replica;
  request.size = share.replicas;
  request.prefix = absl::StrCat(task.rendezvous_prefix(), "dp/", task.rank(), "/");
  request.timeout = rpc::FromProtoDuration(task.comm_timeout());
  return request;
}

TransportRequest DataPlaneRequest(const v1::TaskAssignment& task, const TaskSetup& setup) {
  TransportRequest request;
  request.backend = task.transport();
  request.rank = task.rank();
  request.world_size = task.world_size();
  request.prefix = task.rendezvous_prefix();
  if (ShareOf(task).replicas > 1) absl::StrAppend(&request.prefix, "replica/", task.replica(), "/");
  // A replacement replica's pipeline meets apart from the lost one's keys.
  if (task.has_join()) absl::StrAppend(&request.prefix, "heal-", task.join().healing(), "/");
  request.timeout = rpc::FromProtoDuration(task.comm_timeout());
  request.stage_to_rank.assign(task.stage_to_rank().begin(), task.stage_to_rank().end());
  request.forward_only = setup.forward_only;
  request.skips = setup.skips;
  request.tied_ends = TiedPairOf(setup.spec, task.num_stages()).has_value();
  return request;
}

}  // namespace stagecoach::runtime
