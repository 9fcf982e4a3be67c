#include "worker/model/hf_weights.h"

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "common/hf/decoder_tensors.h"
#include "common/safetensors/model_dir.h"
#include "common/util/status_macros.h"
#include "worker/model/hf_tensors.h"

namespace stagecoach::model {

absl::Status LoadHfWeights(const std::string& dir, bool tied, StageModel& stage) {
  ASSIGN_OR_RETURN(const safetensors::ModelDir files, safetensors::ModelDir::Open(dir));
  torch::NoGradGuard no_grad;
  for (auto& [name, p] : stage.NamedParameters()) {
    std::optional<std::string> hf_name =
        tied && name == "head.weight" ? hf::HfName("embed.weight") : hf::HfName(name);
    if (!hf_name.has_value()) {
      return absl::InternalError(absl::StrCat("parameter ", name, " has no Hugging Face name"));
    }
    ASSIGN_OR_RETURN(torch::Tensor value,
                     ReadParameter(files, *hf_name, p.sizes().vec(), torch::kFloat32));
    p.copy_(value);
  }
  return absl::OkStatus();
}

}  // namespace stagecoach::model
