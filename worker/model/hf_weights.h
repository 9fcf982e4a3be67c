// A Llama-family stage's parameters from a Hugging Face checkpoint directory (model.hf): each
// parameter is read by its Hugging Face name (common/hf/decoder_tensors.h) out of the
// directory's memory-mapped safetensors, converted to fp32 (the job's master weights), and
// copied into the stage; only the stage's own tensors are touched. A tied model's head copy on
// another stage reads the embedding (model.embed_tokens.weight). Errors name the directory and
// the tensor (hf_tensors.h): a missing tensor, another shape, an integer dtype.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "worker/model/stage_model.h"

namespace stagecoach::model {

absl::Status LoadHfWeights(const std::string& dir, bool tied, StageModel& stage);

}  // namespace stagecoach::model
