// Admission: a submitted spec becomes a job ready to queue, or a refusal that names the field.
// It parses the spec, gets the model's layers (from the spec for a built-in model, else from a
// live worker's InspectModel), plans stages, ranks and the schedule, and verifies the checkpoint
// the job resumes from. Nothing is queued here: on any error the caller queues nothing.
//
// No lock of its own; thread-safe (it reads the worker registry, which has its own lock, and
// calls a worker without holding any lock). Calls may take as long as a worker's inspection
// (AdmissionOptions::inspect_timeout).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/spec/job_spec.h"
#include "common/spec/spec_limits.h"
#include "coordinator/checkpoints/checkpoint_collection.h"
#include "coordinator/planning/plan_search.h"
#include "coordinator/planning/planner.h"
#include "coordinator/workers/worker_client.h"
#include "coordinator/workers/worker_registry.h"
#include "stagecoach/v1/coordinator.pb.h"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::coordinator {

struct AdmissionOptions {
  // Bound on the InspectModel call that gives the planner a TorchScript model's layers (or
  // profiles a model's layers for split.policy profiled).
  absl::Duration inspect_timeout = absl::Seconds(120);
  // Timed repetitions of each layer when profiling; 0 lets the worker choose (a plan search's
  // profiles then take 15).
  int profile_iterations = 0;
  // What a spec may ask for (spec::CheckSpecLimits, checked before anything else).
  spec::SpecLimits limits;
  // Bound on planning (after the model's inspection): past it the job is refused with
  // DEADLINE_EXCEEDED.
  absl::Duration plan_timeout = absl::Seconds(60);
  // What the plan search assumes a message between workers costs.
  CostAssumptions costs = DefaultCostAssumptions();
};

// A job that passed admission.
struct AdmittedJob {
  spec::JobSpec spec;
  std::string spec_yaml;  // as the job's tasks get it (for Infer: rewritten, see AdmitInference)
  Plan plan;
  // training.resume_from, verified; nullopt without one.
  std::optional<VerifiedResume> resume;
  // For a `schedule.kind: auto` spec: the plan the search chose and its runner-up (spec and
  // spec_yaml are then the chosen plan's: its schedule, microbatches, stages and policy).
  std::optional<v1::PlanChoice> plan_choice;
};

// What a plan search found for a spec (Admission::SearchPlans).
struct SearchedPlans {
  spec::JobSpec spec;
  SearchResult result;
  // The profiles the search scaled its layers from, and the worker that measured them.
  std::vector<LayerProfile> profiles;
  std::string profiled_by;
};

class Admission {
 public:
  // `registry` and `workers` must outlive it.
  Admission(AdmissionOptions options, const WorkerRegistry* registry, WorkerClient* workers);

  // A training (or ForwardOnly-schedule) job. `schedule.kind: auto` runs the plan search
  // (SearchPlans) and plans the fastest candidate within placement.memory_limit (refused,
  // naming the field and the smallest peak found, when none is); a named schedule with a
  // placement.memory_limit is refused when its predicted peak is over it.
  // INVALID_ARGUMENT naming the field path when the
  // spec is invalid, cannot be planned, resumes from a checkpoint that does not verify or would
  // overwrite a checkpoint. A TorchScript model, or split.policy profiled, is first inspected by
  // a live worker (one of the spec's device if any, idle before busy): FAILED_PRECONDITION when
  // no worker is alive, INVALID_ARGUMENT with the worker's message when it cannot load or run
  // the model, UNAVAILABLE / DEADLINE_EXCEEDED when it does not answer in time.
  // A spec over AdmissionOptions::limits is refused first (INVALID_ARGUMENT naming the field
  // and the limit). Planning gives up with DEADLINE_EXCEEDED after plan_timeout, and with
  // CANCELLED as soon as `caller_gone` (when set) returns true.
  absl::StatusOr<AdmittedJob> AdmitTraining(const std::string& spec_yaml, const std::string& origin,
                                            const std::function<bool()>& caller_gone = nullptr);

  // The plan search for a spec (plan_search.h), as `stagectl plan` asks: the model profiled on
  // a live worker at the largest and the smallest microbatch searched, then every candidate
  // planned and simulated. `memory_limit_bytes` > 0 replaces placement.memory_limit. Errors
  // as AdmitTraining's (the spec, the worker) and SearchPlans'.
  absl::StatusOr<SearchedPlans> SearchPlans(const std::string& spec_yaml, const std::string& origin,
                                            int64_t memory_limit_bytes,
                                            const std::function<bool()>& caller_gone = nullptr);

  // A TorchScript model's layers and split candidates as a worker of `device` (any when empty)
  // inspects them (`stagectl inspect`); `torchscript` is model.torchscript as a spec writes it.
  // Errors as AdmitTraining's inspection, plus INVALID_ARGUMENT naming model.torchscript for a
  // value a spec cannot hold.
  absl::StatusOr<v1::DescribeModelResponse> DescribeModel(const std::string& torchscript,
                                                          const std::string& device);

  // An Infer job: `spec_yaml` planned as a ForwardOnly job of one step whose batch is `inputs`
  // (the spec's schedule files, checkpoints and data section do not apply; profiled layer times
  // are measured on the spec's own data). Errors as AdmitTraining, plus INVALID_ARGUMENT naming
  // `inputs...` or `schedule.microbatches` when the batch does not fit.
  absl::StatusOr<AdmittedJob> AdmitInference(const std::string& spec_yaml,
                                             const std::string& origin,
                                             const v1::TensorData& inputs,
                                             const std::function<bool()>& caller_gone = nullptr);

 private:
  // The model's layers to plan `spec` by (see AdmitTraining); `inspect_yaml` is what the worker
  // inspects.
  // `profiled_by`, when given, receives the inspecting worker's id; `force_profile` profiles
  // whatever the spec needs.
  absl::StatusOr<std::vector<v1::LayerInfo>> ModelLayers(const spec::JobSpec& spec,
                                                         const std::string& inspect_yaml,
                                                         const PlanOptions& plan_options,
                                                         std::string* profiled_by = nullptr,
                                                         bool force_profile = false);

  // Sends `request` to a live worker of `device` (idle before busy), passing over those that
  // cannot be reached; `what` names the errand in errors; *worker_id receives the one that
  // answered. FAILED_PRECONDITION when none is alive or reachable, INVALID_ARGUMENT with the
  // worker's message (it names the field), other errors naming the worker.
  absl::StatusOr<v1::InspectModelResponse> InspectOnWorker(const std::string& device,
                                                           const v1::InspectModelRequest& request,
                                                           const std::string& what,
                                                           std::string* worker_id);

  // For a spec that leaves the split to its default (docs/spec.md): sets spec->split.policy to
  // the policy to plan with and *why to the reason, and returns the layers to plan by. A
  // built-in model is profiled (`profiled`) when it has more than one stage on more than one
  // worker, ProfileFlops is within kCheapProfileFlops and a live worker answers; otherwise, or
  // when the profile fails, it is split by parameters
  // (`equal-params`), never refused for it. A resumed job takes its checkpoint's partition
  // (planning->stage_first_layers) instead of a profile. A TorchScript model keeps
  // equal-layers (ModelLayers' errors).
  absl::StatusOr<std::vector<v1::LayerInfo>> DefaultSplit(spec::JobSpec* spec,
                                                          const std::string& spec_yaml,
                                                          PlanOptions* planning, std::string* why);

  // The layers profiled at the search's largest and smallest microbatch (one profile when
  // they are the same): the spec with schedule.microbatches set so that one microbatch of
  // training.batch_size has a replica's microbatch rows.
  absl::StatusOr<std::vector<LayerProfile>> SearchProfiles(const spec::JobSpec& spec,
                                                           const std::string& spec_yaml,
                                                           const std::string& origin,
                                                           std::string* profiled_by);

  // AdmitTraining for `schedule.kind: auto`: the search, the choice, the chosen spec planned.
  absl::Status AdmitSearched(const std::string& spec_yaml, const std::string& origin,
                             const std::function<bool()>& caller_gone, AdmittedJob* out);

  // The planner's options for one admission: limits, deadline from now, cancellation.
  PlanOptions Planning(const std::function<bool()>& caller_gone, bool client_batches) const;

  const AdmissionOptions options_;
  const WorkerRegistry* const registry_;
  WorkerClient* const workers_;
};

}  // namespace stagecoach::coordinator
