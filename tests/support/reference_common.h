// What the plain-LibTorch references (reference_mlp, reference_gpt, reference_llama) share with
// each other, and nothing with the worker: LibTorch's CPU autocast to bf16, the decoders'
// synthetic token rows written again from training_data.h's definition, and their training loop.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace stagecoach::testing {

// LibTorch's CPU autocast to bf16 while alive (what torch.autocast("cpu", torch.bfloat16)
// does); nothing when `on` is false.
class CpuBf16Autocast {
 public:
  explicit CpuBf16Autocast(bool on) : on_(on) {
    if (!on_) return;
    at::autocast::set_cpu_enabled(true);
    at::autocast::set_autocast_cpu_dtype(torch::kBFloat16);
    at::autocast::increment_nesting();
  }
  ~CpuBf16Autocast() {
    if (!on_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_cpu_enabled(false);
  }
  CpuBf16Autocast(const CpuBf16Autocast&) = delete;
  CpuBf16Autocast& operator=(const CpuBf16Autocast&) = delete;

 private:
  bool on_;
};

// A decoder's synthetic (inputs, targets) of step `step`: per row a start and a stride drawn
// from generator(seed + 1 + step) (all starts first), tokens (start + i * stride) mod vocab,
// i in [0, seq]; inputs the first seq, targets the last seq.
inline std::pair<torch::Tensor, torch::Tensor> SyntheticTokenRows(uint64_t seed, int64_t step,
                                                                  int64_t rows, int64_t seq,
                                                                  int64_t vocab) {
  at::Generator gen = at::detail::createCPUGenerator(seed + 1 + step);
  const torch::Tensor start = torch::randint(0, vocab, {rows, 1}, gen, torch::kInt64);
  const torch::Tensor stride =
      torch::randint(1, std::max<int64_t>(vocab, 2), {rows, 1}, gen, torch::kInt64);
  const torch::Tensor i = torch::arange(seq + 1, torch::kInt64).unsqueeze(0);
  const torch::Tensor t = (start + i * stride).remainder(vocab);
  return {t.slice(1, 0, seq), t.slice(1, 1, seq + 1)};
}

// A decoder reference's training (GptReferenceConfig, LlamaReferenceConfig: their data and
// optimizer fields): c.steps steps on SyntheticTokenRows, each batch split with tensor_split
// into c.microbatches, loss = the mean of the microbatch cross-entropies of forward(inputs)
// (under CpuBf16Autocast when `bf16`), AdamW or SGD, clip_grad_norm_ with c.max_norm. Appends
// each step's loss (the mean of the microbatch losses) and, with clipping, gradient norm.
template <typename Config, typename Forward>
void TrainDecoderOnSyntheticTokens(const Config& c, const std::vector<torch::Tensor>& params,
                                   Forward forward, bool bf16, std::vector<double>* losses,
                                   std::vector<double>* grad_norms) {
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (c.optimizer == "adamw") {
    opt = std::make_unique<torch::optim::AdamW>(
        params, torch::optim::AdamWOptions(c.lr).weight_decay(c.weight_decay));
  } else {
    opt = std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(c.lr).momentum(c.momentum).weight_decay(c.weight_decay));
  }
  for (int64_t step = 0; step < c.steps; ++step) {
    const auto [x, y] = SyntheticTokenRows(c.data_seed, step, c.batch_size, c.seq, c.vocab);
    const auto xs = torch::tensor_split(x, c.microbatches, 0);
    const auto ys = torch::tensor_split(y, c.microbatches, 0);
    opt->zero_grad();
    std::vector<torch::Tensor> step_losses;
    double sum = 0;
    for (int mb = 0; mb < c.microbatches; ++mb) {
      torch::Tensor logits;
      {
        CpuBf16Autocast autocast(bf16);
        logits = forward(xs[mb]);
      }
      step_losses.push_back(torch::nn::functional::cross_entropy(
          logits.reshape({-1, c.vocab}), ys[mb].reshape(-1)));
      sum += step_losses.back().template item<double>();
    }
    torch::stack(step_losses).mean().backward();
    if (c.max_norm.has_value()) {
      grad_norms->push_back(torch::nn::utils::clip_grad_norm_(params, *c.max_norm));
    }
    opt->step();
    losses->push_back(sum / c.microbatches);
  }
}

// Greedy decoding without a cache, for the decoders' references: each of the `n` tokens is the
// argmax (the lowest index on ties; torch::argmax does not promise which) of `forward`'s logits
// [1, T, vocab] at the last position of the context (prompt + tokens so far), or of its last
// `window` tokens when it is longer (a sliding window).
template <typename Forward>
std::vector<int64_t> GreedyDecode(Forward&& forward, const std::vector<int64_t>& prompt, int n,
                                  int64_t window) {
  torch::NoGradGuard no_grad;
  std::vector<int64_t> context = prompt, out;
  for (int i = 0; i < n; ++i) {
    const size_t from = context.size() > static_cast<size_t>(window)
                            ? context.size() - static_cast<size_t>(window)
                            : 0;
    const std::vector<int64_t> last(context.begin() + from, context.end());
    const torch::Tensor logits =
        forward(torch::tensor(last, torch::kInt64).unsqueeze(0))[0][-1].contiguous();
    const float* values = logits.data_ptr<float>();
    int64_t best = 0;
    for (int64_t v = 1; v < logits.size(0); ++v) {
      if (values[v] > values[best]) best = v;
    }
    context.push_back(best);
    out.push_back(best);
  }
  return out;
}

}  // namespace stagecoach::testing
