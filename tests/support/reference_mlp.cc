#include "tests/support/reference_mlp.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "tests/support/reference_common.h"

namespace stagecoach::testing {

namespace {

// training.lr_schedule at step k of T, from its definition.
double ScheduledLr(const ReferenceConfig& c, int64_t k) {
  const int64_t T = c.timeline_steps > 0 ? c.timeline_steps : c.steps;
  const int64_t w = c.warmup_steps;
  const bool decays = c.lr_schedule != "constant";
  if (decays && k >= T - 1) return c.min_lr;
  if (k < w) return c.lr * (k + 1) / (w + 1);
  if (!decays) return c.lr;
  const double t = static_cast<double>(k - w) / static_cast<double>(T - 1 - w);
  if (c.lr_schedule == "linear") return c.lr + (c.min_lr - c.lr) * t;
  return c.min_lr + (c.lr - c.min_lr) * 0.5 * (1 + std::cos(M_PI * t));
}

// Step `step`'s batch of synthetic data from `seed` (a random linear teacher drawn from `seed`),
// or of the dataset.
std::pair<torch::Tensor, torch::Tensor> BatchOf(const ReferenceConfig& c, uint64_t seed,
                                                int64_t step, bool from_dataset) {
  const int64_t in = c.sizes.front(), out = c.sizes.back();
  torch::Tensor x, y;
  if (from_dataset) {
    // The batch_size rows from (step * batch_size) mod N, wrapping around.
    const int64_t n = c.dataset_inputs.size(0);
    std::vector<int64_t> rows;
    for (int64_t i = 0; i < c.batch_size; ++i) rows.push_back((step * c.batch_size + i) % n);
    const torch::Tensor index = torch::tensor(rows, torch::kInt64);
    x = c.dataset_inputs.index_select(0, index).to(torch::kFloat32);
    y = c.dataset_targets.index_select(0, index);
    y = c.loss == "cross_entropy" ? y.to(torch::kInt64) : y.to(torch::kFloat32);
    return {x, y};
  }
  at::Generator teacher_gen = at::detail::createCPUGenerator(seed);
  const torch::Tensor teacher =
      torch::randn({in, out}, teacher_gen, torch::kFloat32) / std::sqrt(static_cast<double>(in));
  at::Generator gen = at::detail::createCPUGenerator(seed + 1 + step);
  x = torch::randn({c.batch_size, in}, gen, torch::kFloat32);
  const torch::Tensor logits = torch::matmul(x, teacher);
  y = c.loss == "cross_entropy" ? logits.argmax(1) : torch::tanh(logits);
  return {x, y};
}

// The microbatch losses of one batch through `layers`.
std::vector<torch::Tensor> MicrobatchLosses(const ReferenceConfig& c,
                                            std::vector<torch::nn::Linear>& layers,
                                            const torch::Tensor& x, const torch::Tensor& y) {
  const auto xs = torch::tensor_split(x, c.microbatches, 0);
  const auto ys = torch::tensor_split(y, c.microbatches, 0);
  std::vector<torch::Tensor> losses;
  for (int mb = 0; mb < c.microbatches; ++mb) {
    torch::Tensor h = xs[mb];
    {
      CpuBf16Autocast autocast(c.bf16);
      for (size_t i = 0; i < layers.size(); ++i) {
        h = layers[i]->forward(h);
        if (i + 1 < layers.size()) h = torch::relu(h);
      }
    }
    h = h.to(torch::kFloat32);
    losses.push_back(c.loss == "cross_entropy" ? torch::nn::functional::cross_entropy(h, ys[mb])
                                               : torch::nn::functional::mse_loss(h, ys[mb]));
  }
  return losses;
}

double MeanOf(const std::vector<torch::Tensor>& losses) {
  double sum = 0;
  for (const auto& l : losses) sum += l.item<double>();
  return sum / static_cast<double>(losses.size());
}

}  // namespace

ReferenceResult TrainReference(const ReferenceConfig& c) {
  torch::manual_seed(c.model_seed);
  std::vector<torch::nn::Linear> layers;
  std::vector<torch::Tensor> params;
  for (size_t i = 0; i + 1 < c.sizes.size(); ++i) {
    layers.emplace_back(torch::nn::LinearOptions(c.sizes[i], c.sizes[i + 1]));
    params.push_back(layers.back()->weight);
    params.push_back(layers.back()->bias);
  }
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (c.optimizer == "sgd") {
    opt = std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(c.lr).momentum(c.momentum).weight_decay(c.weight_decay));
  } else {
    opt = std::make_unique<torch::optim::AdamW>(
        params, torch::optim::AdamWOptions(c.lr).weight_decay(c.weight_decay));
  }
  const bool from_dataset = c.dataset_inputs.defined() && c.dataset_targets.defined();

  ReferenceResult result;
  for (size_t i = 0; i < layers.size(); ++i) {
    result.initial_params[std::to_string(i) + ".weight"] = layers[i]->weight.detach().clone();
    result.initial_params[std::to_string(i) + ".bias"] = layers[i]->bias.detach().clone();
  }
  for (int64_t step = 0; step < c.steps; ++step) {
    const auto [x, y] = BatchOf(c, c.data_seed, step, from_dataset);
    opt->zero_grad();
    const std::vector<torch::Tensor> losses = MicrobatchLosses(c, layers, x, y);
    torch::stack(losses).mean().backward();
    const double lr = ScheduledLr(c, step);
    for (auto& group : opt->param_groups()) group.options().set_lr(lr);
    result.lrs.push_back(lr);
    bool finite = true;
    for (const auto& p : params) finite = finite && torch::isfinite(p.grad()).all().item<bool>();
    result.skipped.push_back(!finite);
    if (finite && c.max_norm.has_value() && c.clip_groups.empty()) {
      result.grad_norms.push_back(torch::nn::utils::clip_grad_norm_(params, *c.max_norm));
    } else if (finite && c.max_norm.has_value()) {
      for (const std::vector<int>& group : c.clip_groups) {
        std::vector<torch::Tensor> mine;
        for (int layer : group) {
          mine.push_back(layers[layer]->weight);
          mine.push_back(layers[layer]->bias);
        }
        torch::nn::utils::clip_grad_norm_(mine, *c.max_norm);
      }
    }
    if (finite) opt->step();
    result.losses.push_back(finite ? MeanOf(losses) : std::nan(""));
    if (c.eval_every > 0 && (step + 1) % c.eval_every == 0) {
      torch::NoGradGuard no_grad;
      double sum = 0;
      for (int64_t j = 0; j < c.eval_batches; ++j) {
        const auto [ex, ey] = BatchOf(c, c.eval_data_seed, j, /*from_dataset=*/false);
        sum += MeanOf(MicrobatchLosses(c, layers, ex, ey));
      }
      result.evals[step] = sum / static_cast<double>(c.eval_batches);
    }
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    result.params[std::to_string(i) + ".weight"] = layers[i]->weight.detach().clone();
    result.params[std::to_string(i) + ".bias"] = layers[i]->bias.detach().clone();
  }
  return result;
}

ReferenceDataset LoadReferenceDataset(const std::string& path) {
  ReferenceDataset out;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    ADD_FAILURE() << "cannot open " << path;
    return out;
  }
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  const c10::IValue value = torch::pickle_load(bytes);
  if (!value.isGenericDict()) {
    ADD_FAILURE() << path << " does not hold a dict";
    return out;
  }
  for (const auto& entry : value.toGenericDict()) {
    const std::string key = entry.key().toStringRef();
    if (key == "inputs") out.inputs = entry.value().toTensor();
    if (key == "targets") out.targets = entry.value().toTensor();
  }
  if (!out.inputs.defined() || !out.targets.defined()) {
    ADD_FAILURE() << path << " lacks \"inputs\" or \"targets\"";
  }
  return out;
}

torch::Tensor ReferenceForward(const std::vector<int64_t>& sizes, uint64_t model_seed,
                               const torch::Tensor& inputs) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(model_seed);
  std::vector<torch::nn::Linear> layers;
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    layers.emplace_back(torch::nn::LinearOptions(sizes[i], sizes[i + 1]));
  }
  torch::Tensor h = inputs;
  for (size_t i = 0; i < layers.size(); ++i) {
    h = layers[i]->forward(h);
    if (i + 1 < layers.size()) h = torch::relu(h);
  }
  return h;
}

std::string OptimizerYaml(const ReferenceConfig& config) {
  if (config.optimizer == "sgd") {
    return absl::StrFormat("{kind: sgd, lr: %g, momentum: %g, weight_decay: %g}", config.lr,
                           config.momentum, config.weight_decay);
  }
  return absl::StrFormat("{kind: adamw, lr: %g, weight_decay: %g}", config.lr, config.weight_decay);
}

double ExpectParamsMatchReference(const std::map<std::string, torch::Tensor>& got,
                                  const ReferenceResult& ref, double rtol, double atol) {
  double max_diff = 0;
  EXPECT_EQ(got.size(), ref.params.size());
  for (const auto& [name, want] : ref.params) {
    auto it = got.find(name);
    if (it == got.end()) {
      ADD_FAILURE() << name << " is in no stage";
      continue;
    }
    if (it->second.sizes() != want.sizes()) {
      ADD_FAILURE() << name << " has shape " << it->second.sizes() << ", want " << want.sizes();
      continue;
    }
    const double diff = (it->second - want).abs().max().item<double>();
    max_diff = std::max(max_diff, diff);
    EXPECT_TRUE(torch::allclose(it->second, want, rtol, atol)) << name << " differs by " << diff;
    EXPECT_GT((want - ref.initial_params.at(name)).abs().max().item<double>(), 100 * atol)
        << name << " barely changed in training";
  }
  return max_diff;
}

std::string MlpSpecYaml(const ReferenceConfig& config, const MlpJobLayout& layout,
                        const std::string& ckpt_dir, const std::string& data_yaml) {
  const std::string data = data_yaml.empty()
                               ? absl::StrCat("{kind: synthetic, seed: ", config.data_seed, "}")
                               : data_yaml;
  return absl::StrCat(
      "name: ", layout.name, "\n",  //
      "model:\n  builtin: {family: mlp, sizes: [", absl::StrJoin(config.sizes, ", "),
      "], seed: ", config.model_seed, "}\n", "split: {stages: ", layout.stages, "}\n",       //
      "schedule: {kind: ", layout.schedule, ", microbatches: ", layout.microbatches, "}\n",  //
      "placement: {workers: ", layout.workers, "}\n",                                        //
      "training:\n  batch_size: ", config.batch_size, "\n  steps: ", config.steps,
      "\n  loss: ", config.loss, "\n  optimizer: ", OptimizerYaml(config),
      "\n  checkpoint: {dir: ", ckpt_dir, "}\n",  //
      "data: ", data, "\n");
}

ReferenceConfig MlpReference(std::vector<int64_t> sizes, uint64_t model_seed, uint64_t data_seed,
                             int64_t batch_size, int microbatches, int64_t steps, std::string loss,
                             std::string optimizer, double lr, double momentum,
                             double weight_decay) {
  ReferenceConfig r;
  r.sizes = std::move(sizes);
  r.model_seed = model_seed;
  r.data_seed = data_seed;
  r.batch_size = batch_size;
  r.microbatches = microbatches;
  r.steps = steps;
  r.loss = std::move(loss);
  r.optimizer = std::move(optimizer);
  r.lr = lr;
  r.momentum = momentum;
  r.weight_decay = weight_decay;
  return r;
}

ReferenceConfig SmallSgdMlp(int64_t steps, uint64_t model_seed, uint64_t data_seed) {
  ReferenceConfig r;
  r.sizes = {8, 16, 16, 4};
  r.model_seed = model_seed;
  r.data_seed = data_seed;
  r.batch_size = 16;
  r.microbatches = 4;
  r.steps = steps;
  r.loss = "mse";
  r.optimizer = "sgd";
  r.lr = 0.05;
  return r;
}

}  // namespace stagecoach::testing
