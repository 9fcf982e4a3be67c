#include "common/spec/spec_limits.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/spec/spec_parser.h"
#include "common/util/checked_math.h"

namespace stagecoach::spec {
namespace {

class LimitChecker {
 public:
  explicit LimitChecker(const SpecLimits& limits) : limits_(limits) {}

  // Records an error when `value` is over the limit `field` of SpecLimits.
  void Check(const std::string& path, int64_t value, int64_t SpecLimits::*field) {
    const int64_t limit = limits_.*field;
    if (value <= limit) return;
    for (const SpecLimitFlag& f : SpecLimitFlags()) {
      if (f.field != field) continue;
      errors_.push_back(absl::StrCat(path, ": ", value, " is over the limit of ", limit, " ",
                                     f.what, " (the coordinator's --", f.flag, ")"));
      return;
    }
  }
  void Error(std::string message) { errors_.push_back(std::move(message)); }

  absl::Status Result() const {
    if (errors_.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrJoin(errors_, "; "));
  }

 private:
  const SpecLimits& limits_;
  std::vector<std::string> errors_;
};

void CheckModel(const BuiltinModel& model, LimitChecker& check) {
  if (model.family == "mlp") {
    check.Check("model.builtin.sizes", static_cast<int64_t>(model.sizes.size()) - 1,
                &SpecLimits::max_layers);
    for (size_t i = 0; i < model.sizes.size(); ++i) {
      check.Check(absl::StrCat("model.builtin.sizes[", i, "]"), model.sizes[i],
                  &SpecLimits::max_dimension);
    }
  } else if (model.family == "gpt") {
    // embed, the blocks, norm, head.
    check.Check("model.builtin.layers", model.layers + 3, &SpecLimits::max_layers);
    check.Check("model.builtin.vocab", model.vocab, &SpecLimits::max_dimension);
    check.Check("model.builtin.d_model", model.d_model, &SpecLimits::max_dimension);
    check.Check("model.builtin.heads", model.heads, &SpecLimits::max_dimension);
    check.Check("model.builtin.seq", model.seq, &SpecLimits::max_dimension);
  } else if (model.family == "llama" && model.decoder.has_value()) {
    const hf::DecoderConfig& c = *model.decoder;
    check.Check("model.builtin.num_hidden_layers", c.num_hidden_layers + 3,
                &SpecLimits::max_layers);
    for (const auto& [key, value] :
         {std::pair<const char*, int64_t>{"vocab_size", c.vocab_size},
          {"hidden_size", c.hidden_size},
          {"intermediate_size", c.intermediate_size},
          {"num_attention_heads", c.num_attention_heads},
          {"head_dim", c.head_dim},
          {"max_position_embeddings", c.max_position_embeddings}}) {
      check.Check(absl::StrCat("model.builtin.", key), value, &SpecLimits::max_dimension);
    }
  }
}

}  // namespace

const std::vector<SpecLimitFlag>& SpecLimitFlags() {
  static const std::vector<SpecLimitFlag> kFlags = {
      {"max-layers", &SpecLimits::max_layers, "layers"},
      {"max-stages", &SpecLimits::max_stages, "stages"},
      {"max-microbatches", &SpecLimits::max_microbatches, "microbatches"},
      {"max-workers", &SpecLimits::max_workers, "workers"},
      {"max-replicas", &SpecLimits::max_replicas, "replicas"},
      {"max-dimension", &SpecLimits::max_dimension, "elements in one model dimension"},
      {"max-batch-size", &SpecLimits::max_batch_size, "rows"},
      {"max-parameters", &SpecLimits::max_parameters, "parameters"},
      {"max-actions", &SpecLimits::max_actions, "schedule actions"},
  };
  return kFlags;
}

absl::Status CheckSpecLimits(const JobSpec& spec, const SpecLimits& limits) {
  LimitChecker check(limits);
  bool layers_ok = true;
  if (spec.model.builtin.has_value()) {
    CheckModel(*spec.model.builtin, check);
    layers_ok = BuiltinLayerCount(*spec.model.builtin) <= limits.max_layers;
  }
  check.Check("split.stages", spec.split.stages, &SpecLimits::max_stages);
  if (!spec.split.points.empty()) {
    check.Check("split.points", static_cast<int64_t>(spec.split.points.size()) + 1,
                &SpecLimits::max_stages);
  }
  check.Check("schedule.microbatches", spec.schedule.microbatches, &SpecLimits::max_microbatches);
  check.Check("placement.replicas", spec.placement.replicas, &SpecLimits::max_replicas);
  const int64_t workers = static_cast<int64_t>(std::max(1, spec.placement.workers)) *
                          std::max(1, spec.placement.replicas);
  check.Check(
      spec.placement.replicas > 1 ? "placement.workers x placement.replicas" : "placement.workers",
      workers, &SpecLimits::max_workers);
  check.Check("training.batch_size", spec.training.batch_size, &SpecLimits::max_batch_size);
  check.Check("data.seq", spec.data.seq, &SpecLimits::max_dimension);
  if (spec.eval.has_value()) {
    int64_t rows = 0;
    if (!CheckedMulAdd(spec.eval->batches, spec.training.batch_size, 0, &rows)) rows = INT64_MAX;
    check.Check("eval.batches x training.batch_size", rows, &SpecLimits::max_batch_size);
  }
  if (spec.model.builtin.has_value() && layers_ok) {
    absl::StatusOr<std::vector<int64_t>> counts = BuiltinLayerParameterCounts(*spec.model.builtin);
    int64_t total = 0;
    bool fits = counts.ok();
    for (size_t i = 0; fits && i < counts->size(); ++i) {
      fits = !__builtin_add_overflow(total, (*counts)[i], &total);
    }
    if (!fits) {
      check.Error("model.builtin: its parameter count does not fit in 64 bits");
    } else {
      check.Check("model.builtin (parameters)", total, &SpecLimits::max_parameters);
    }
  }
  return check.Result();
}

}  // namespace stagecoach::spec
