#include "worker/model/precision.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include "absl/strings/str_cat.h"

#define STAGECOACH_AUTOCAST_BY_DEVICE \
  (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4))

namespace stagecoach::model {
namespace {

bool AutocastEnabled(bool cuda) {
#if STAGECOACH_AUTOCAST_BY_DEVICE
  return at::autocast::is_autocast_enabled(cuda ? at::kCUDA : at::kCPU);
#else
  return cuda ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
#endif
}

torch::ScalarType AutocastDtype(bool cuda) {
#if STAGECOACH_AUTOCAST_BY_DEVICE
  return at::autocast::get_autocast_dtype(cuda ? at::kCUDA : at::kCPU);
#else
  return cuda ? at::autocast::get_autocast_gpu_dtype() : at::autocast::get_autocast_cpu_dtype();
#endif
}

void SetAutocast(bool cuda, bool enabled, torch::ScalarType dtype) {
#if STAGECOACH_AUTOCAST_BY_DEVICE
  at::autocast::set_autocast_enabled(cuda ? at::kCUDA : at::kCPU, enabled);
  at::autocast::set_autocast_dtype(cuda ? at::kCUDA : at::kCPU, dtype);
#else
  if (cuda) {
    at::autocast::set_enabled(enabled);
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    at::autocast::set_cpu_enabled(enabled);
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
#endif
}

}  // namespace

absl::StatusOr<Precision> ParsePrecision(const std::string& name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16;
  return absl::InvalidArgumentError(
      absl::StrCat("training.precision: must be fp32 or bf16, got '", name, "'"));
}

AutocastGuard::AutocastGuard(Precision precision, const torch::Device& device) {
  if (precision != Precision::kBf16) return;
  active_ = true;
  cuda_ = device.is_cuda();
  was_enabled_ = AutocastEnabled(cuda_);
  was_dtype_ = AutocastDtype(cuda_);
  SetAutocast(cuda_, true, torch::kBFloat16);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  // The outermost guard drops the bf16 copies of the weights autocast cached meanwhile.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  SetAutocast(cuda_, was_enabled_, was_dtype_);
}

torch::Tensor ToWire(const torch::Tensor& t, Precision precision) {
  if (precision != Precision::kBf16 || !t.is_floating_point()) return t;
  return t.to(torch::kBFloat16);
}

torch::Tensor ToFloat32(const torch::Tensor& t) {
  if (!t.is_floating_point() || t.scalar_type() == torch::kFloat32) return t;
  return t.to(torch::kFloat32);
}

}  // namespace stagecoach::model
