// Tied parameters across stages: a built-in decoder's token embedding and output head with
// model.builtin.tie_embeddings (gpt) or tie_word_embeddings (llama), when they are in different
// stages (Megatron's "embedding group"). Each of the two stages holds a copy
// (spec::TiedEmbeddingName in stage 0, "head.weight" in the last stage), both start from the embedding's initial values, and after every step's
// backward (and replica reduction) the two gradients are summed between their stages, in one
// order on both sides (first stage's + last stage's), so both copies get the same bits, the
// optimizers step them alike and they stay identical. In one stage the head uses the
// embedding's own tensor (one parameter; gpt.h), and there is nothing to do here.
//
// The two stages on one rank (V placement: ZBVZeroBubble, DualPipeV) sum in memory; on two
// ranks the copies' gradients cross once each way on the pipeline's transport (the
// kTiedGradients link of message_tags.h): the lower rank sends first, then receives.
//
// The global gradient norm counts the tied weight once: the last stage's copy is left out
// (not_counted). Checkpoints hold it once too: the last stage's training-state file and export
// leave "head.weight" out, and a rank resuming that stage restores its copy (value and
// optimizer state, equal to the first stage's) from the first stage's training-state file
// (RestoreTiedCopies; the coordinator lists that file in the rank's ResumeTask).
//
// Not thread-safe: the task's thread, between the executor's step and the optimizer step.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/spec/job_spec.h"
#include "stagecoach/v1/types.pb.h"
#include "worker/model/stage_model.h"
#include "worker/runtime/checkpoint/state_file.h"
#include "worker/transport/transport.h"

namespace stagecoach::runtime {

// The two copies: stage and parameter name of each.
struct TiedPair {
  int first_stage = 0;
  std::string first_name;
  int second_stage = 0;
  std::string second_name;
};

// The job's tied pair across stages, if it has one: a gpt with tie_embeddings split into more
// than one stage.
std::optional<TiedPair> TiedPairOf(const spec::JobSpec& spec, int num_stages);

// After a stage `stage` of this rank was restored from a checkpoint without its tied copy: the
// copy's value (and with `optimizer` its state) from the first stage's training-state file of
// `resume`, read from `files`. Nothing for other stages.
absl::Status RestoreTiedCopy(const TiedPair& pair, const v1::ResumeTask& resume,
                             const StateFiles& files, int stage,
                             const std::pair<std::string, torch::Tensor>& copy,
                             torch::optim::Optimizer* optimizer);

class TiedGradients {
 public:
  // For the rank `rank` of a pipeline whose stages are on `stage_to_rank`; `stages` are the
  // rank's (they must outlive this). Null when the rank holds neither copy. INVALID_ARGUMENT
  // when a stage lacks its copy or the copies' shapes differ.
  static absl::StatusOr<std::unique_ptr<TiedGradients>> Create(
      const TiedPair& pair, const std::vector<int>& stage_to_rank, int rank,
      const std::map<int, model::StageModel*>& stages, transport::Transport* transport,
      torch::Device device, absl::Duration timeout);

  // Sums the copies' gradients (see the file comment); an undefined gradient counts as zero.
  // The transport's errors, naming the peer.
  absl::Status SumGradients();

  // The copy the global norm leaves out when this rank holds it (undefined otherwise).
  const torch::Tensor& not_counted() const { return second_; }
  // Parameter names this rank's checkpoint files leave out, by stage.
  std::map<int, std::string> Omitted() const;

 private:
  TiedGradients() = default;

  TiedPair pair_;
  torch::Tensor first_;   // defined when this rank holds the first copy
  torch::Tensor second_;  // defined when this rank holds the second copy
  int peer_ = -1;         // the other copy's rank, when it is not this one
  int rank_ = 0;
  transport::Transport* transport_ = nullptr;
  torch::Device device_ = torch::kCPU;
  absl::Duration timeout_;
};

}  // namespace stagecoach::runtime
