#include "coordinator/lifecycle/admission.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/rpc/tensor_data.h"
#include "common/spec/hf_model_spec.h"
#include "common/spec/spec_overrides.h"
#include "common/spec/spec_parser.h"
#include "common/util/byte_size.h"
#include "common/util/logging.h"
#include "common/util/status_macros.h"
#include "coordinator/checkpoints/checkpoint_collection.h"
#include "coordinator/lifecycle/hf_weights_check.h"
#include "coordinator/planning/split_policies.h"

namespace stagecoach::coordinator {
namespace {

// What DescribeModel sends a worker, model.torchscript and placement.device set.
constexpr char kDescribeSpec[] =
    "name: describe-model\nmodel: {torchscript: unset}\nschedule: {kind: GPipe, microbatches: 1}\n"
    "training: {batch_size: 1, steps: 1}\n";

// Timed repeats of each layer in a plan search's profiles (the worker's default is 3).
constexpr int kSearchProfileIterations = 15;

// The spec of an Infer job: `spec_yaml` with a ForwardOnly schedule, `batch_size` rows and one
// step; schedule files, checkpoints and the data section do not apply to inference.
// With `keep_data` the data section stays (what profiling the model's layers measures on).
absl::StatusOr<std::string> InferenceSpecYaml(const std::string& spec_yaml,
                                              const std::string& origin, int64_t batch_size,
                                              bool keep_data = false) {
  spec::SpecOverrides overrides;
  overrides.set = {{"schedule.kind", "ForwardOnly"},
                   {"training.batch_size", absl::StrCat(batch_size)},
                   {"training.steps", "1"}};
  overrides.remove = {"schedule.csv", "schedule.csv_format", "schedule.csv_text",
                      "training.checkpoint"};
  if (!keep_data) overrides.remove.push_back("data");
  return spec::ApplySpecOverrides(spec_yaml, origin, overrides);
}

// The workers to inspect the model on, in the order to ask them: live ones, those with the
// job's device first (profiled times are measured there), then idle ones before busy ones.
std::vector<WorkerRecord> InspectingWorkers(const WorkerRegistry& registry,
                                            const std::string& device) {
  std::vector<std::pair<int, WorkerRecord>> scored;
  for (WorkerRecord& w : registry.All()) {
    if (w.state == v1::WORKER_STATE_LOST) continue;
    const int score =
        (DeviceMatches(device, w.device) ? 2 : 0) + (w.state == v1::WORKER_STATE_IDLE ? 1 : 0);
    scored.emplace_back(score, std::move(w));
  }
  std::stable_sort(scored.begin(), scored.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<WorkerRecord> out;
  for (auto& [score, w] : scored) out.push_back(std::move(w));
  return out;
}

// placement.memory_limit against `plan`'s prediction: INVALID_ARGUMENT naming the field when
// a rank is predicted over it, or when there is no prediction to hold it to.
absl::Status CheckMemoryLimit(const spec::JobSpec& spec, const Plan& plan) {
  const int64_t limit = spec.placement.memory_limit_bytes;
  if (limit <= 0 || !plan.has_backward) return absl::OkStatus();
  if (plan.predicted_memory.empty()) {
    return absl::InvalidArgumentError(
        "placement.memory_limit: the model's profile carries no measured sizes to predict "
        "memory from (a CPU worker measures them; CUDA profiles do not yet)");
  }
  for (size_t r = 0; r < plan.predicted_memory.size(); ++r) {
    const PredictedRankMemory& m = plan.predicted_memory[r];
    if (m.static_bytes + m.peak_bytes <= limit) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "placement.memory_limit: worker rank ", r, " of the ", plan.schedule_name,
        " plan is predicted to hold ", util::FormatBytes(m.static_bytes + m.peak_bytes),
        " (parameters, gradients and optimizer state ", util::FormatBytes(m.static_bytes),
        ", activations at ", m.peak_action, " ", util::FormatBytes(m.peak_bytes),
        "), over the limit of ", util::FormatBytes(limit),
        "; schedule.kind auto searches for a plan that fits"));
  }
  return absl::OkStatus();
}

// Whether `spec` leaves the split to its default: no split.policy, no split.points.
bool LeavesSplitToDefault(const spec::JobSpec& spec) {
  return !spec.split.policy_given && spec.split.points.empty();
}

}  // namespace

Admission::Admission(AdmissionOptions options, const WorkerRegistry* registry,
                     WorkerClient* workers)
    : options_(options), registry_(registry), workers_(workers) {}

absl::StatusOr<std::vector<v1::LayerInfo>> Admission::ModelLayers(const spec::JobSpec& spec,
                                                                  const std::string& inspect_yaml,
                                                                  const PlanOptions& plan_options,
                                                                  std::string* profiled_by,
                                                                  bool force_profile) {
  const bool profile = force_profile || NeedsProfile(spec);
  if (!profile && !NeedsInspection(spec)) return BuiltinLayers(*spec.model.builtin);
  // What the planner refuses anyway is refused before a worker is troubled.
  RETURN_IF_ERROR(CheckPlannable(spec, plan_options));
  const std::string what = spec.model.torchscript.has_value() ? "inspect model.torchscript"
                                                              : "profile the model's layers";
  v1::InspectModelRequest request;
  request.set_spec_yaml(inspect_yaml);
  request.set_profile(profile);
  // A plan search ranks plans whose predictions differ by a few percent: its profiles take
  // more repeats than a split does, unless the coordinator was told how many.
  request.set_profile_iterations(options_.profile_iterations > 0 || !force_profile
                                     ? options_.profile_iterations
                                     : kSearchProfileIterations);
  std::string worker;
  ASSIGN_OR_RETURN(v1::InspectModelResponse inspected,
                   InspectOnWorker(spec.placement.device, request, what, &worker));
  spdlog::info("worker {} inspected the model: {} layers{}", worker, inspected.layers_size(),
               profile ? ", profiled" : "");
  if (profiled_by != nullptr) *profiled_by = worker;
  return std::vector<v1::LayerInfo>(inspected.layers().begin(), inspected.layers().end());
}

absl::StatusOr<v1::InspectModelResponse> Admission::InspectOnWorker(
    const std::string& device, const v1::InspectModelRequest& request, const std::string& what,
    std::string* worker_id) {
  const std::vector<WorkerRecord> candidates = InspectingWorkers(*registry_, device);
  if (candidates.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("no live worker to ", what, "; start a worker first"));
  }
  // A worker that cannot be reached (it died and its heartbeats have not yet run out) is passed
  // over for the next one; any other error is the answer.
  std::string unreachable;
  const WorkerRecord* worker = nullptr;
  absl::StatusOr<v1::InspectModelResponse> inspected;
  for (const WorkerRecord& candidate : candidates) {
    inspected = workers_->InspectModel(candidate.address, request, options_.inspect_timeout);
    if (inspected.ok() || !absl::IsUnavailable(inspected.status())) {
      worker = &candidate;
      break;
    }
    spdlog::warn("could not reach worker {} at {} to {}: {}", candidate.id, candidate.address, what,
                 inspected.status().message());
    absl::StrAppend(&unreachable, unreachable.empty() ? "" : "; ", candidate.id, " at ",
                    candidate.address, ": ", inspected.status().message());
  }
  if (worker == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("could not ", what, ": no live worker could be reached (", unreachable, ")"));
  }
  if (!inspected.ok()) {
    const absl::Status& error = inspected.status();
    if (absl::IsInvalidArgument(error)) {
      // The worker's verdict on the spec (it names the field).
      return absl::InvalidArgumentError(
          absl::StrCat(error.message(), " (inspected by worker ", worker->id, ")"));
    }
    return absl::Status(error.code(), absl::StrCat("could not ", what, " on worker ", worker->id,
                                                   " at ", worker->address, ": ", error.message()));
  }
  *worker_id = worker->id;
  return inspected;
}

absl::StatusOr<v1::DescribeModelResponse> Admission::DescribeModel(const std::string& torchscript,
                                                                   const std::string& device) {
  // The smallest spec that names the model; the worker reads only its model section.
  spec::SpecOverrides overrides;
  overrides.set = {{"model.torchscript", torchscript}};
  if (!device.empty()) overrides.set.emplace_back("placement.device", device);
  ASSIGN_OR_RETURN(const std::string spec_yaml,
                   spec::ApplySpecOverrides(kDescribeSpec, "the model to describe", overrides));
  ASSIGN_OR_RETURN(const spec::JobSpec spec, spec::ReadJobSpec(spec_yaml, "the model to describe"));
  RETURN_IF_ERROR(spec::CheckSpecLimits(spec, options_.limits));
  v1::InspectModelRequest request;
  request.set_spec_yaml(spec_yaml);
  v1::DescribeModelResponse out;
  std::string worker;
  ASSIGN_OR_RETURN(
      v1::InspectModelResponse inspected,
      InspectOnWorker(spec.placement.device, request, "inspect model.torchscript", &worker));
  *out.mutable_layers() = std::move(*inspected.mutable_layers());
  *out.mutable_split_candidates() = std::move(*inspected.mutable_split_candidates());
  out.set_sequential(inspected.sequential());
  out.set_model_sha256(inspected.model_sha256());
  out.set_inspected_by(worker);
  return out;
}

absl::StatusOr<std::vector<v1::LayerInfo>> Admission::DefaultSplit(spec::JobSpec* spec,
                                                                   const std::string& spec_yaml,
                                                                   PlanOptions* planning,
                                                                   std::string* why) {
  if (!spec->model.builtin.has_value()) {
    *why = "for a TorchScript model";
    return ModelLayers(*spec, spec_yaml, *planning);
  }
  std::vector<v1::LayerInfo> builtin = BuiltinLayers(*spec->model.builtin);
  spec->split.policy = "equal-params";
  if (!spec->training.resume_from.empty()) {
    // A resumed job keeps the stages its checkpoint was written with, when they fit.
    absl::StatusOr<CheckpointManifest> m = ReadManifest(spec->training.resume_from);
    if (m.ok() && !m->stages.empty()) {
      for (const ManifestStage& st : m->stages) {
        planning->stage_first_layers.push_back(st.first_layer);
      }
      *why = "the partition of the checkpoint it resumes";
      return builtin;
    }
  }
  if (spec->split.stages == 1 || spec->placement.workers == 1) {
    *why = "one stage or one worker: no ranks to balance";
    return builtin;
  }
  const double flops = ProfileFlops(*spec);
  if (flops > kCheapProfileFlops) {
    *why = absl::StrFormat(
        "profiling the model would take about %.2g floating-point operations, over the %.2g a "
        "default split spends",
        flops, kCheapProfileFlops);
    return builtin;
  }
  if (InspectingWorkers(*registry_, spec->placement.device).empty()) {
    *why = "no live worker to profile the model";
    return builtin;
  }
  spec->split.policy = "profiled";
  absl::StatusOr<std::vector<v1::LayerInfo>> profiled = ModelLayers(*spec, spec_yaml, *planning);
  std::string refused;
  if (!profiled.ok()) {
    refused = std::string(profiled.status().message());
  } else if (profiled->size() != builtin.size()) {
    refused =
        absl::StrCat("the profile has ", profiled->size(), " layers, the model ", builtin.size());
  }
  if (!refused.empty()) {
    // The user asked for no profile: plan without one, and say why.
    spdlog::warn("a default split could not profile the model ({}); splitting by parameters",
                 refused);
    spec->split.policy = "equal-params";
    *why = absl::StrCat("profiling the model failed: ", refused);
    return builtin;
  }
  *why = "profiling the model was cheap";
  return profiled;
}

PlanOptions Admission::Planning(const std::function<bool()>& caller_gone,
                                bool client_batches) const {
  PlanOptions plan;
  plan.client_batches = client_batches;
  plan.limits = options_.limits;
  plan.deadline = absl::Now() + options_.plan_timeout;
  plan.cancelled = caller_gone;
  return plan;
}

absl::StatusOr<AdmittedJob> Admission::AdmitTraining(const std::string& spec_yaml,
                                                     const std::string& origin,
                                                     const std::function<bool()>& caller_gone) {
  AdmittedJob out;
  ASSIGN_OR_RETURN(out.spec, spec::ReadJobSpec(spec_yaml, origin));
  RETURN_IF_ERROR(spec::CheckSpecLimits(out.spec, options_.limits));
  RETURN_IF_ERROR(CheckHfWeights(out.spec));
  if (spec::IsAutoSchedule(out.spec.schedule)) {
    RETURN_IF_ERROR(AdmitSearched(spec_yaml, origin, caller_gone, &out));
  } else {
    PlanOptions planning = Planning(caller_gone, false);
    std::vector<v1::LayerInfo> layers;
    std::string why;
    if (LeavesSplitToDefault(out.spec)) {
      ASSIGN_OR_RETURN(layers, DefaultSplit(&out.spec, spec_yaml, &planning, &why));
    } else {
      ASSIGN_OR_RETURN(layers, ModelLayers(out.spec, spec_yaml, {}));
    }
    absl::StatusOr<Plan> plan = PlanJob(out.spec, layers, planning);
    if (!plan.ok() && !planning.stage_first_layers.empty()) {
      // The resumed checkpoint's partition does not fit this schedule: plan by the policy, and
      // let VerifyResumeFrom say what differs.
      planning.stage_first_layers.clear();
      why = "";
      plan = PlanJob(out.spec, std::move(layers), planning);
    }
    ASSIGN_OR_RETURN(out.plan, std::move(plan));
    if (!why.empty()) out.plan.split = absl::StrCat(out.plan.split, " (default: ", why, ")");
    RETURN_IF_ERROR(CheckMemoryLimit(out.spec, out.plan));
    out.spec_yaml = spec_yaml;
  }
  ASSIGN_OR_RETURN(out.resume, VerifyResumeFrom(out.spec, out.plan));
  RETURN_IF_ERROR(
      CheckCheckpointTargetsFree(out.spec, out.resume.has_value() ? out.resume->manifest.step : 0));
  return out;
}

absl::StatusOr<AdmittedJob> Admission::AdmitInference(const std::string& spec_yaml,
                                                      const std::string& origin,
                                                      const v1::TensorData& inputs,
                                                      const std::function<bool()>& caller_gone) {
  RETURN_IF_ERROR(rpc::ValidateTensorData(inputs, "inputs"));
  if (inputs.shape_size() < 1 || inputs.shape(0) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("inputs.shape: needs at least one row (dim 0 is the batch), got ",
                     rpc::DescribeTensorData(inputs)));
  }
  const int64_t rows = inputs.shape(0);
  // Parsed first with the largest batch size, so that the microbatch count is checked against
  // the input's rows here rather than against a batch size the user never wrote.
  ASSIGN_OR_RETURN(std::string probe_yaml,
                   InferenceSpecYaml(spec_yaml, origin, std::numeric_limits<int64_t>::max()));
  ASSIGN_OR_RETURN(spec::JobSpec probe, spec::ReadJobSpec(probe_yaml, origin));
  probe.training.batch_size = rows;  // the limits apply to the client's batch
  RETURN_IF_ERROR(spec::CheckSpecLimits(probe, options_.limits));
  RETURN_IF_ERROR(CheckHfWeights(probe));
  if (static_cast<int64_t>(probe.schedule.microbatches) * probe.placement.replicas > rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule.microbatches: must be <= the rows of inputs (", rpc::DescribeTensorData(inputs),
        probe.placement.replicas > 1
            ? absl::StrCat(" for ", probe.placement.replicas,
                           " replicas: ", rows / probe.placement.replicas, " rows each")
            : "",
        "), got ", probe.schedule.microbatches));
  }
  AdmittedJob out;
  ASSIGN_OR_RETURN(out.spec_yaml, InferenceSpecYaml(spec_yaml, origin, rows));
  ASSIGN_OR_RETURN(out.spec, spec::ReadJobSpec(out.spec_yaml, origin));
  // The batch is the client's; profiled layer times are measured on the spec's own data. A
  // split left to its default is by parameters (equal layers for a TorchScript model): an Infer
  // call is not held up by a profile.
  const bool default_split = LeavesSplitToDefault(out.spec);
  if (default_split && out.spec.model.builtin.has_value()) out.spec.split.policy = "equal-params";
  PlanOptions client_batches;
  client_batches.client_batches = true;
  std::string inspect_yaml = out.spec_yaml;
  if (NeedsProfile(out.spec)) {
    ASSIGN_OR_RETURN(inspect_yaml, InferenceSpecYaml(spec_yaml, origin, rows, /*keep_data=*/true));
  }
  ASSIGN_OR_RETURN(std::vector<v1::LayerInfo> layers,
                   ModelLayers(out.spec, inspect_yaml, client_batches));
  ASSIGN_OR_RETURN(out.plan, PlanJob(out.spec, std::move(layers),
                                     Planning(caller_gone, /*client_batches=*/true)));
  if (default_split) absl::StrAppend(&out.plan.split, " (default for inference)");
  // Inference on a checkpoint's weights (training.resume_from).
  ASSIGN_OR_RETURN(out.resume, VerifyResumeFrom(out.spec, out.plan));
  return out;
}

absl::StatusOr<std::vector<LayerProfile>> Admission::SearchProfiles(const spec::JobSpec& spec,
                                                                    const std::string& spec_yaml,
                                                                    const std::string& origin,
                                                                    std::string* profiled_by) {
  const std::vector<int> counts = SearchMicrobatchCounts(spec);
  const int replicas = std::max(1, spec.placement.replicas);
  std::vector<int> profiled = {counts.front()};
  if (counts.back() != counts.front()) profiled.push_back(counts.back());
  std::vector<LayerProfile> out;
  for (int m : profiled) {
    spec::SpecOverrides overrides;
    overrides.set = {{"schedule.microbatches", absl::StrCat(static_cast<int64_t>(m) * replicas)}};
    overrides.remove = {"placement.replicas", "placement.shard_optimizer", "placement.shard",
                        "placement.unshard"};
    ASSIGN_OR_RETURN(std::string inspect_yaml,
                     spec::ApplySpecOverrides(spec_yaml, origin, overrides));
    LayerProfile profile;
    profile.rows = (spec.training.batch_size / replicas + m - 1) / m;
    ASSIGN_OR_RETURN(profile.layers,
                     ModelLayers(spec, inspect_yaml, {}, profiled_by, /*force_profile=*/true));
    out.push_back(std::move(profile));
  }
  return out;
}

absl::StatusOr<SearchedPlans> Admission::SearchPlans(const std::string& spec_yaml,
                                                     const std::string& origin,
                                                     int64_t memory_limit_bytes,
                                                     const std::function<bool()>& caller_gone) {
  SearchedPlans out;
  ASSIGN_OR_RETURN(out.spec, spec::ReadJobSpec(spec_yaml, origin));
  RETURN_IF_ERROR(spec::CheckSpecLimits(out.spec, options_.limits));
  RETURN_IF_ERROR(CheckHfWeights(out.spec));
  RETURN_IF_ERROR(CheckPlannable(out.spec));
  if (out.spec.placement.workers <= 0) {
    return absl::InvalidArgumentError(
        "placement.workers: required to search plans (the search chooses how the workers are "
        "used: schedule, stages per worker, microbatches and split, not how many)");
  }
  ASSIGN_OR_RETURN(out.profiles, SearchProfiles(out.spec, spec_yaml, origin, &out.profiled_by));
  SearchOptions options;
  options.memory_limit_bytes = memory_limit_bytes;
  options.planning = Planning(caller_gone, false);
  options.costs = options_.costs;
  ASSIGN_OR_RETURN(out.result, coordinator::SearchPlans(out.spec, out.profiles, options));
  return out;
}

absl::Status Admission::AdmitSearched(const std::string& spec_yaml, const std::string& origin,
                                      const std::function<bool()>& caller_gone, AdmittedJob* out) {
  ASSIGN_OR_RETURN(SearchedPlans searched, SearchPlans(spec_yaml, origin, 0, caller_gone));
  ASSIGN_OR_RETURN(v1::PlanChoice choice, ChoosePlan(searched.result));
  const v1::PlanCandidate& chosen = choice.chosen();
  ASSIGN_OR_RETURN(out->spec_yaml,
                   spec::ApplySpecOverrides(spec_yaml, origin, CandidateOverrides(chosen)));
  ASSIGN_OR_RETURN(out->spec, spec::ReadJobSpec(out->spec_yaml, origin));
  const int64_t rows = (out->spec.training.batch_size / std::max(1, out->spec.placement.replicas) +
                        chosen.microbatches() - 1) /
                       chosen.microbatches();
  PlanOptions planning = Planning(caller_gone, false);
  // The partition the search simulated (a memory split is a search of its own).
  planning.stage_first_layers.assign(chosen.stage_first_layers().begin(),
                                     chosen.stage_first_layers().end());
  ASSIGN_OR_RETURN(out->plan, PlanJob(out->spec, LayersForRows(searched.profiles, rows), planning));
  spdlog::info("plan search: {} of {} candidates fit; chose {} (predicted step {:.4f} s)",
               choice.fitting(), choice.candidates(), DescribeCandidate(chosen),
               chosen.step_seconds());
  out->plan_choice = std::move(choice);
  return absl::OkStatus();
}

}  // namespace stagecoach::coordinator
