// The numerical contract's reference: the same MLP trained in one process without a pipeline,
// written in plain LibTorch and sharing no code with the worker's model, data or executor.
// It follows the definitions users rely on (DESIGN.md "Spec" and "Numerical contract";
// worker/runtime/data/training_data.h for synthetic and tensors data): parameters from
// torch.manual_seed(seed) and nn.Linear layers built in order; each step's batch split with
// tensor_split; step loss = mean over microbatches of each microbatch's loss; gradients of that
// mean.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace stagecoach::testing {

struct ReferenceConfig {
  std::vector<int64_t> sizes;
  uint64_t model_seed = 0;
  uint64_t data_seed = 0;
  int64_t batch_size = 0;
  int microbatches = 1;
  int64_t steps = 1;
  std::string loss = "mse";       // mse | cross_entropy
  std::string optimizer = "sgd";  // sgd | adamw
  double lr = 0.01;
  double momentum = 0.0;  // sgd
  double weight_decay = 0.0;
  // data.kind tensors when both are defined: inputs [N, in] (converted to float32), targets [N]
  // class indices or [N, out]; step k uses rows (k * batch_size + i) mod N, i < batch_size,
  // instead of the synthetic data drawn from data_seed.
  torch::Tensor dataset_inputs;
  torch::Tensor dataset_targets;

  // The training recipe (docs/training-recipe.md), done the plain way: the optimizer's lr set
  // before each step from the schedule (written here from its definition), torch's own
  // clip_grad_norm_, and a step skipped when a gradient is not finite.
  std::string lr_schedule = "constant";  // constant | linear | cosine
  int64_t warmup_steps = 0;
  double min_lr = 0.0;
  // T of the schedule; 0 means `steps`.
  int64_t timeline_steps = 0;
  // training.grad_clip.max_norm; unset: no clipping.
  std::optional<double> max_norm;
  // Not what a job does: clip each group of layers (indices) by its own norm, as ranks clipping
  // alone would. Empty: one global norm.
  std::vector<std::vector<int>> clip_groups;
  // eval: every eval_every steps (0: never), eval_batches batches of synthetic data from
  // eval_data_seed (batch j drawn like training step j's).
  int64_t eval_every = 0;
  int64_t eval_batches = 0;
  uint64_t eval_data_seed = 0;
  // training.precision bf16: the forward under LibTorch's CPU autocast to bfloat16 (its own
  // calls, not the worker's shim), the output cast to float32 for the loss. The MLP's values
  // between layers are bf16 then, so a pipeline's bf16 stage boundaries round nothing more.
  bool bf16 = false;
};

// The MLP `sizes` from `model_seed` trained on synthetic data from `data_seed`: batch_size rows
// in `microbatches`, `steps` steps, `loss` and `optimizer` (lr, momentum, weight_decay).
ReferenceConfig MlpReference(std::vector<int64_t> sizes, uint64_t model_seed, uint64_t data_seed,
                             int64_t batch_size, int microbatches, int64_t steps, std::string loss,
                             std::string optimizer, double lr, double momentum,
                             double weight_decay);

// The small MLP the control tests train: sizes 8-16-16-4, MSE, SGD with lr 0.05, batch 16 in 4
// microbatches, `steps` steps from the given seeds.
ReferenceConfig SmallSgdMlp(int64_t steps, uint64_t model_seed, uint64_t data_seed);

// The "inputs" and "targets" tensors of a file written by torch.save({"inputs": X,
// "targets": Y}), read with torch::pickle_load; undefined tensors (and a test failure) when the
// file is missing or holds something else.
struct ReferenceDataset {
  torch::Tensor inputs;
  torch::Tensor targets;
};
ReferenceDataset LoadReferenceDataset(const std::string& path);

struct ReferenceResult {
  std::vector<double> losses;                           // one per step (NaN when skipped)
  std::vector<double> lrs;                              // the lr each step used
  std::vector<double> grad_norms;                       // before clipping, with max_norm
  std::vector<bool> skipped;                            // a gradient was not finite
  std::map<int64_t, double> evals;                      // step -> eval loss after it
  std::map<std::string, torch::Tensor> params;          // "{layer}.weight" / "{layer}.bias", final
  std::map<std::string, torch::Tensor> initial_params;  // the same, before the first step
};

ReferenceResult TrainReference(const ReferenceConfig& config);

// The job spec's `training.optimizer` flow map for `config` (sgd with lr, momentum and
// weight_decay; adamw with lr and weight_decay), so a test's spec and its reference agree.
std::string OptimizerYaml(const ReferenceConfig& config);

// Checks, as test expectations, that `got` (a job's final weights by name) holds exactly the
// reference's parameters, each allclose to it (rtol, atol) and moved in training by more than
// 100 * atol (so the comparison means something). Returns the largest difference.
double ExpectParamsMatchReference(const std::map<std::string, torch::Tensor>& got,
                                  const ReferenceResult& ref, double rtol, double atol);

// Where and how a test runs `config`'s MLP as a job, for MlpSpecYaml.
struct MlpJobLayout {
  std::string name;
  std::string schedule;  // schedule.kind
  int stages = 1;
  int workers = 1;
  int microbatches = 1;
};

// The job spec that trains `config`'s MLP (sizes, model seed, batch size, steps, loss and
// optimizer from `config`) as `layout` says, with stage weights written to `ckpt_dir` after the
// last step. `data_yaml` is the `data` flow map; empty means synthetic data from
// config.data_seed.
std::string MlpSpecYaml(const ReferenceConfig& config, const MlpJobLayout& layout,
                        const std::string& ckpt_dir, const std::string& data_yaml = "");

// The model's output for `inputs` (float32, [rows, sizes[0]]) in one process without a
// pipeline or microbatches: nn.Linear layers built in order after torch.manual_seed(model_seed),
// ReLU between them.
torch::Tensor ReferenceForward(const std::vector<int64_t>& sizes, uint64_t model_seed,
                               const torch::Tensor& inputs);

}  // namespace stagecoach::testing
