#include "worker/runtime/checkpoint/optimizer_state.h"

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/torch.h>

#include <memory>

#include "absl/strings/str_cat.h"

namespace stagecoach::runtime {
namespace {

const torch::optim::OptimizerParamState* FindParamState(const torch::optim::Optimizer& optimizer,
                                                        const torch::Tensor& param) {
  const auto& state = optimizer.state();
  auto it = state.find(OptimizerStateKey<std::decay_t<decltype(state)>>(param));
  return it == state.end() ? nullptr : it->second.get();
}

absl::Status Unsupported() {
  return absl::UnimplementedError("optimizer state: only sgd and adamw state can be moved");
}

}  // namespace

absl::StatusOr<StateFields> ParamStateFields(const torch::optim::Optimizer& optimizer,
                                             const torch::Tensor& param) {
  const bool adamw = dynamic_cast<const torch::optim::AdamW*>(&optimizer) != nullptr;
  if (!adamw && dynamic_cast<const torch::optim::SGD*>(&optimizer) == nullptr) {
    return Unsupported();
  }
  StateFields out;
  const torch::optim::OptimizerParamState* st = FindParamState(optimizer, param);
  if (st == nullptr) return out;
  if (!adamw) {
    const auto& sgd = static_cast<const torch::optim::SGDParamState&>(*st);
    if (sgd.momentum_buffer().defined()) out["momentum_buffer"] = sgd.momentum_buffer().clone();
    return out;
  }
  const auto& adam = static_cast<const torch::optim::AdamWParamState&>(*st);
  out["exp_avg"] = adam.exp_avg().clone();
  out["exp_avg_sq"] = adam.exp_avg_sq().clone();
  if (adam.max_exp_avg_sq().defined()) out["max_exp_avg_sq"] = adam.max_exp_avg_sq().clone();
  out["step"] = torch::tensor(adam.step(), torch::kInt64);
  return out;
}

absl::Status SetParamStateFields(torch::optim::Optimizer& optimizer, const torch::Tensor& param,
                                 const StateFields& fields, const std::string& where) {
  const bool adamw = dynamic_cast<const torch::optim::AdamW*>(&optimizer) != nullptr;
  if (!adamw && dynamic_cast<const torch::optim::SGD*>(&optimizer) == nullptr) {
    return Unsupported();
  }
  auto& state_map = optimizer.state();
  const auto key = OptimizerStateKey<std::decay_t<decltype(state_map)>>(param);
  if (fields.empty()) {
    state_map.erase(key);
    return absl::OkStatus();
  }
  auto field = [&](const std::string& name) -> absl::StatusOr<torch::Tensor> {
    auto it = fields.find(name);
    if (it == fields.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": optimizer state lacks '", name, "'"));
    }
    if (name != "step" && it->second.numel() != param.numel()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": optimizer state '", name, "' has ",
                                                     it->second.numel(),
                                                     " elements, the parameter ", param.numel()));
    }
    return name == "step" ? it->second : it->second.to(param.options()).reshape(param.sizes());
  };
  if (!adamw) {
    absl::StatusOr<torch::Tensor> buf = field("momentum_buffer");
    if (!buf.ok()) return buf.status();
    auto state = std::make_unique<torch::optim::SGDParamState>();
    state->momentum_buffer(buf->clone());
    state_map[key] = std::move(state);
    return absl::OkStatus();
  }
  absl::StatusOr<torch::Tensor> exp_avg = field("exp_avg"), exp_avg_sq = field("exp_avg_sq"),
                                step = field("step");
  for (const auto* f : {&exp_avg, &exp_avg_sq, &step}) {
    if (!f->ok()) return f->status();
  }
  auto state = std::make_unique<torch::optim::AdamWParamState>();
  state->step(step->item<int64_t>());
  state->exp_avg(exp_avg->clone());
  state->exp_avg_sq(exp_avg_sq->clone());
  if (fields.count("max_exp_avg_sq") > 0) {
    absl::StatusOr<torch::Tensor> max_sq = field("max_exp_avg_sq");
    if (!max_sq.ok()) return max_sq.status();
    state->max_exp_avg_sq(max_sq->clone());
  }
  state_map[key] = std::move(state);
  return absl::OkStatus();
}

}  // namespace stagecoach::runtime
