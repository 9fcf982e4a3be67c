#include "worker/runtime/task/evaluation.h"

#include <torch/torch.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"
#include "worker/runtime/executor/forward_actions.h"
#include "worker/runtime/task/data_steps.h"

namespace stagecoach::runtime {
namespace {

// Puts every stage of the rank in evaluation mode for the lifetime of the guard.
class EvaluationMode {
 public:
  explicit EvaluationMode(const TaskStages& stages) : stages_(stages) {
    for (const auto& [index, stage] : stages_.by_index) stage->SetTraining(false);
  }
  ~EvaluationMode() {
    for (const auto& [index, stage] : stages_.by_index) stage->SetTraining(true);
  }

 private:
  const TaskStages& stages_;
};

}  // namespace

Evaluator::Evaluator(const TaskSetup& setup, ExecutorOptions options,
                     transport::Transport* transport, int replica, int replicas)
    : setup_(setup), options_(std::move(options)), replicas_(replicas), slices_({replica}) {
  executor_ = std::make_unique<PipelineExecutor>(options_, transport, setup.stages->by_index);
  actions_ = ForwardActions(setup.actions);
  owns_first_ = setup.stages->Owns(0);
  owns_last_ = setup.stages->Owns(options_.num_stages - 1);
  by_tokens_ = spec::LossNormalizationOf(setup.spec) == "tokens";
}

absl::StatusOr<std::unique_ptr<Evaluator>> Evaluator::Create(const v1::TaskAssignment& task,
                                                             const TaskSetup& setup,
                                                             transport::Transport* transport,
                                                             ExecutorOptions training_options) {
  training_options.forward_only = true;
  training_options.on_gradients_ready = nullptr;
  std::unique_ptr<Evaluator> evaluator(new Evaluator(setup, std::move(training_options), transport,
                                                     task.replica(), std::max(1, task.replicas())));
  spec::JobSpec eval_spec = setup.spec;
  eval_spec.data = setup.spec.eval->data;
  absl::StatusOr<std::unique_ptr<BatchSource>> data =
      BatchSource::Open(eval_spec, evaluator->owns_first_, evaluator->owns_last_);
  if (!data.ok()) {
    return absl::Status(data.status().code(),
                        absl::StrCat("eval.data: ", data.status().message()));
  }
  evaluator->data_ = *std::move(data);
  return evaluator;
}

bool Evaluator::DueAfter(int64_t global_step) const {
  return setup_.spec.eval.has_value() && (global_step + 1) % setup_.spec.eval->every_steps == 0;
}

absl::StatusOr<Evaluator::Losses> Evaluator::Run() {
  const int m = options_.num_microbatches;
  Losses out;
  EvaluationMode eval_mode(*setup_.stages);
  torch::NoGradGuard no_grad;
  for (int64_t j = 0; j < setup_.spec.eval->batches; ++j) {
    ASSIGN_OR_RETURN(Batch batch, data_->Make(j));
    for (int slice : slices_) {
      const ReplicaShare share{slice, replicas_};
      std::vector<torch::Tensor> inputs, targets;
      if (owns_first_) inputs = ReplicaMicrobatches(batch.inputs, m, share);
      if (owns_last_) targets = ReplicaMicrobatches(batch.targets, m, share);
      if (!shapes_agreed_ || slices_.size() > 1) {
        RETURN_IF_ERROR(executor_->AgreeShapes(MetasOf(inputs)));
        shapes_agreed_ = slices_.size() == 1;
      }
      // Packed rows keep their documents apart here too (rows run whole, not trimmed).
      std::vector<torch::Tensor> segments;
      if (batch.segments.defined()) segments = ReplicaMicrobatches(batch.segments, m, share);
      ASSIGN_OR_RETURN(StepResult result,
                       executor_->RunStep(actions_, inputs, {}, std::nullopt,
                                          segments.empty() ? nullptr : &segments));
      if (!owns_last_) continue;
      for (int mb = 0; mb < m; ++mb) {
        const int64_t counted = by_tokens_ ? CountedTokens(targets.at(mb)) : -1;
        out.losses.push_back(
            counted == 0
                ? 0.0
                : ComputeLoss(setup_.loss, result.outputs.at(mb), targets.at(mb)).item<double>());
        if (by_tokens_) out.tokens.push_back(counted);
      }
    }
  }
  return out;
}

}  // namespace stagecoach::runtime
