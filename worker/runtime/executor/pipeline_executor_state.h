// PipelineExecutor's private parts that its source files share (pipeline_executor.cc: the
// step and its actions; pipeline_executor_shapes.cc: shape agreement;
// pipeline_executor_forward.cc, pipeline_executor_backward.cc: F, B, I, W and their sends;
// pipeline_executor_transfers.cc: posting and waiting for transfers). Not for other callers.
#pragma once

#include <torch/torch.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "worker/runtime/executor/pipeline_executor.h"
#include "worker/runtime/executor/split_backward.h"
#include "worker/transport/transport.h"

namespace stagecoach::runtime {
namespace executor_internal {

inline TensorMeta MetaOf(const torch::Tensor& t) {
  return TensorMeta{t.sizes().vec(), t.scalar_type()};
}

// A stage and microbatch.
struct Key {
  int stage;
  int microbatch;
  friend bool operator<(const Key& a, const Key& b) {
    return a.stage != b.stage ? a.stage < b.stage : a.microbatch < b.microbatch;
  }
};

// A value edge (PipelineExecutor::ValueEdge, by index) for one microbatch.
struct EdgeKey {
  int edge;
  int microbatch;
  friend bool operator<(const EdgeKey& a, const EdgeKey& b) {
    return a.edge != b.edge ? a.edge < b.edge : a.microbatch < b.microbatch;
  }
};

struct PendingRecv {
  torch::Tensor buffer;
  std::unique_ptr<transport::Work> work;
  int peer = -1;
  // dynamic_shapes, header ahead (shape_header.h): the value's shape header on its way;
  // `buffer` and `work` exist once it came.
  torch::Tensor header;
  std::unique_ptr<transport::Work> header_work;
  // dynamic_shapes, framed: `buffer` is the bytes of the header and the largest planned value.
  bool framed = false;
};

struct PendingSend {
  torch::Tensor buffer;  // keeps the bytes alive until the send completed
  std::unique_ptr<transport::Work> work;
  std::string what;
  int peer = -1;  // for the progress beacon's wait
  uint64_t tag = 0;
};

// Runs `fn`, turning LibTorch exceptions into a Status prefixed with `where`.
template <typename Fn>
absl::Status GuardTorch(const std::string& where, Fn&& fn) {
  try {
    return fn();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(where, ": ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(where, ": ", e.what()));
  }
}

}  // namespace executor_internal

// One step's state: what is in flight and what the actions left for each other.
struct PipelineExecutor::StepState {
  using Key = executor_internal::Key;
  using EdgeKey = executor_internal::EdgeKey;
  const std::vector<torch::Tensor>* inputs = nullptr;
  const std::vector<torch::Tensor>* targets = nullptr;
  std::optional<TokenNormalization> tokens;
  const std::vector<torch::Tensor>* segments = nullptr;
  std::map<EdgeKey, executor_internal::PendingRecv> activation_recvs;  // an input value on its way
  std::map<EdgeKey, executor_internal::PendingRecv>
      gradient_recvs;                                       // an output's gradient on its way
  std::map<Key, std::vector<torch::Tensor>> stage_inputs;   // what F consumed
  std::map<Key, std::vector<torch::Tensor>> stage_outputs;  // what F produced (not last stage)
  std::map<Key, torch::Tensor> losses;                      // last stage only
  std::map<EdgeKey, torch::Tensor> handed_values;    // from a local producer, for a local consumer
  std::map<EdgeKey, torch::Tensor> handed_grads;     // from a local consumer, for a local producer
  std::map<EdgeKey, torch::Tensor> input_grads;      // for a producer on another rank, to send
  std::map<Key, PendingWeightGrad> pending_weights;  // I ran, W has not
  std::set<Key> early_sends;                         // F outputs already sent by an OVERLAP_F_B
  std::map<Key, torch::Tensor> rng_states;           // recomputation: the generator's at each F
  std::set<int> last_stage_forwards;                 // microbatches the last stage ran F on
  std::vector<executor_internal::PendingSend> sends;
  // dynamic_shapes: the meta of each value this rank sent or received this step.
  std::map<EdgeKey, TensorMeta> step_metas;
  // Activation sends whose gradient comes back: released when it has (the consumer used them).
  std::map<EdgeKey, executor_internal::PendingSend> activation_sends;
  absl::Time step_start;
  absl::Duration action_wait;  // time the current action spent blocked on receives
  StepResult result;
};

}  // namespace stagecoach::runtime
