#include "worker/model/builtin_stage.h"

#include "absl/strings/str_cat.h"
#include "worker/model/gpt.h"
#include "worker/model/llama.h"
#include "worker/model/mlp.h"

namespace stagecoach::model {

absl::StatusOr<std::unique_ptr<StageModel>> BuildBuiltinStage(const spec::BuiltinModel& model,
                                                              int first_layer, int end_layer) {
  if (model.family == "mlp") return BuildMlpStage(model, first_layer, end_layer);
  if (model.family == "gpt") return BuildGptStage(model, first_layer, end_layer);
  if (model.family == "llama") return BuildLlamaStage(model, first_layer, end_layer);
  return absl::InvalidArgumentError(absl::StrCat(
      "model.builtin.family: '", model.family, "' is not a built-in family (mlp, gpt, llama)"));
}

}  // namespace stagecoach::model
