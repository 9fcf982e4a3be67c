// Admission's check of a model whose weights come from a Hugging Face checkpoint directory
// (model.hf, or training.resume_from naming one; hf_model_spec.h): before
// any worker is troubled, the directory's safetensors (their headers, memory-mapped; no tensor
// data is read) must hold exactly the tensors its config.json's model has, under Hugging Face's
// names, each of the shape the configuration gives and of a floating-point dtype. Refusals are
// INVALID_ARGUMENT naming model.hf, the directory and the tensor: missing, extra (a tensor the
// model does not have), misshaped, not floating-point; and the reader's own errors for a
// damaged file or index (common/safetensors). Thread-safe.
#pragma once

#include "absl/status/status.h"
#include "common/spec/job_spec.h"

namespace stagecoach::coordinator {

// OK for a model whose weights come from nowhere else. `spec` must have been read by
// ReadJobSpec.
absl::Status CheckHfWeights(const spec::JobSpec& spec);

}  // namespace stagecoach::coordinator
