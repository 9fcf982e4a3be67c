// A Llama-family stage's part of a checkpoint's Hugging Face export (common/checkpoint/layout.h,
// hf/): the stage's parameters under Hugging Face's names (common/hf/decoder_tensors.h), in the
// stage's order, cut into parts of at most `max_part_bytes` as save_pretrained cuts shards
// (common/safetensors/model_dir.h's PlanShards), each written durably as
// hf/stage-<s>-<KKKKK>.safetensors in the parameters' own dtype (fp32 master weights), with
// "__metadata__" {"format": "pt"}. The coordinator then writes the index and config.json.
// Thread-safe for distinct stages.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>

#include "absl/status/statusor.h"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::runtime {

// Writes stage `stage`'s parts into `step_dir`/hf/ (created if needed), leaving out the
// parameter named `omitted` (a tied copy: the embedding's stage exports it). Returns each part's
// entry (file "hf/stage-<s>-<KKKKK>.safetensors", size, SHA-256) for the step report; none for a
// stage with no parameters to export. INVALID_ARGUMENT for a parameter without a Hugging Face
// name; the writer's errors naming the file otherwise.
absl::StatusOr<std::vector<v1::StageCheckpointFile>> WriteHfExport(
    const std::string& step_dir, int stage,
    const std::vector<std::pair<std::string, torch::Tensor>>& params, const std::string& omitted,
    uint64_t max_part_bytes);

}  // namespace stagecoach::runtime
