// The coordinator's part of a checkpoint's Hugging Face export (common/checkpoint/layout.h,
// hf/): once every stage's parts are durable, and before the manifest, it writes
// hf/model.safetensors.index.json ({"metadata": {"total_size"}, "weight_map": {tensor: part}},
// read from the parts' headers) and hf/config.json (the model's configuration, torch_dtype
// float32: the parts hold the fp32 master weights), so that transformers' from_pretrained, and
// model: {hf: …}, read hf/ as a model directory. Thread-safe for distinct checkpoints.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "common/hf/decoder_config.h"
#include "coordinator/checkpoints/checkpoint_manifest.h"

namespace stagecoach::coordinator {

// Nothing when no stage file of `manifest` is under hf/. DATA_LOSS naming the part when a part
// cannot be read or two parts hold one tensor; the durable writer's errors otherwise.
absl::Status WriteHfExportIndex(const std::string& step_dir, const CheckpointManifest& manifest,
                                const hf::DecoderConfig& config);

}  // namespace stagecoach::coordinator
