// What the plain-LibTorch references (reference_mlp, reference_gpt, reference_llama) share with
// each other, and nothing with the worker: LibTorch's CPU autocast to bf16, and the decoders'
// synthetic token rows written again from training_data.h's definition.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <utility>

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

}  // namespace stagecoach::testing
