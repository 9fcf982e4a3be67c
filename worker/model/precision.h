// Mixed precision (training.precision) behind one shim: LibTorch's autocast API differs between
// 1.13 (at::autocast::set_cpu_enabled, set_autocast_cpu_dtype, and the CUDA ones) and 2.4+
// (set_autocast_enabled / set_autocast_dtype by device type); this file is the only one that
// calls it.
//
// The bf16 op policy, fixed: under AutocastGuard, autocast runs matmuls (linear, matmul, bmm,
// conv) in bf16 with fp32 master weights cast on the fly; the model runs LayerNorm and softmax on
// fp32 inputs (ToFloat32; LibTorch 1.13's CPU LayerNorm refuses bf16 input and autocast does not
// cast it); the executor casts each stage's floating outputs to bf16 (ToWire), so that
// activations, and the gradients that come back for them, cross the wire in bf16, and the last
// stage's output to fp32 for the loss. Parameters, their gradients and the optimizer stay fp32.
// fp32 changes nothing.
//
// The guard is thread-local, like autocast itself: hold it on the thread that runs the forward.
#pragma once

#include <torch/types.h>

#include <string>

#include "absl/status/statusor.h"

namespace stagecoach::model {

enum class Precision { kFp32, kBf16 };

// training.precision -> Precision; INVALID_ARGUMENT naming the field for another name.
absl::StatusOr<Precision> ParsePrecision(const std::string& name);

// While alive: autocast to bf16 on this thread for `device`'s type (CPU or CUDA), with bf16;
// nothing with kFp32. Restores the thread's previous autocast state when it ends, and clears
// autocast's cast-weight cache when it was the outermost.
class AutocastGuard {
 public:
  AutocastGuard(Precision precision, const torch::Device& device);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool active_ = false;
  bool cuda_ = false;
  bool was_enabled_ = false;
  torch::ScalarType was_dtype_ = torch::kBFloat16;
};

// A stage output as it crosses to the next stage: floating tensors in bf16 with kBf16, else as
// they are.
torch::Tensor ToWire(const torch::Tensor& t, Precision precision);

// A floating tensor in fp32 (LayerNorm and softmax inputs, the loss's input); others as they are.
torch::Tensor ToFloat32(const torch::Tensor& t);

}  // namespace stagecoach::model
