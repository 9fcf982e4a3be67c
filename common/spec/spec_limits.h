// Admission limits: the sizes a job spec may ask for, checked before anything is allocated or
// searched in proportion to them (planning a spec is then bounded in time and memory), with an
// error that names the field, the value and the limit. The defaults are generous for real jobs
// and each has a coordinator flag to raise it (docs/spec.md "Limits").
//
// Parameter counts are computed in checked 64-bit arithmetic: a model whose count overflows is
// refused, never planned with a negative count.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/spec/builtin_model.h"
#include "common/spec/job_spec.h"

namespace stagecoach::spec {

struct SpecLimits {
  // Top-level layers of the model (built-in: BuiltinLayerCount; TorchScript: as inspected).
  int64_t max_layers = 100'000;
  // Pipeline stages (split.stages, or split points + 1, or as the schedule derives them).
  int64_t max_stages = 1'024;
  // schedule.microbatches.
  int64_t max_microbatches = 65'536;
  // Workers a job needs: placement.workers x placement.replicas.
  int64_t max_workers = 4'096;
  // placement.replicas.
  int64_t max_replicas = 1'024;
  // Any one model dimension: mlp sizes[i]; gpt vocab, d_model, heads, seq; data.seq.
  int64_t max_dimension = 16'777'216;  // 2^24
  // training.batch_size (rows per step), and eval.batches x batch size.
  int64_t max_batch_size = 16'777'216;
  // The model's parameters, in total (a built-in model's, computed from the spec).
  int64_t max_parameters = 1'000'000'000'000;  // 10^12
  // Actions of the lowered schedule over all ranks (compute and communication). Before the
  // schedule is built the planner bounds it by 8 x stages x microbatches.
  int64_t max_actions = 4'000'000;
};

// OK when `spec` is within `limits`, else INVALID_ARGUMENT listing every field over its limit:
// "model.builtin.layers: 1000000 is over the limit of 100000 layers (the coordinator's
// --max-layers)". Also refuses a built-in model whose parameter count overflows 64 bits.
absl::Status CheckSpecLimits(const JobSpec& spec, const SpecLimits& limits);

// The coordinator flag that raises each limit ("max-layers", ...), for error messages and docs.
struct SpecLimitFlag {
  const char* flag;
  int64_t SpecLimits::*field;
  const char* what;  // "layers", "stages", ...
};
const std::vector<SpecLimitFlag>& SpecLimitFlags();

}  // namespace stagecoach::spec
