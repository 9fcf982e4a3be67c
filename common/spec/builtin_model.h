// The built-in model families' layers, as the planner, the spec's checks and the workers see
// them, from the spec alone (no LibTorch):
//   mlp    layers "0" .. "n-1", each Linear(sizes[i], sizes[i+1]) (weight and bias);
//   gpt    "embed" (token and position tables), "blocks.0" .. "blocks.N-1", "norm", "head"
//          (worker/model/gpt.h);
//   llama  "embed" (token table), "layers.0" .. "layers.N-1", "norm", "head"
//          (worker/model/llama.h), sized by its Hugging Face configuration.
// gpt and llama are decoders: they take token ids [B, T] and give logits [B, T, vocab], train
// on tokens (or the synthetic tokens of training_data.h) with cross_entropy, and may tie the
// head's weight to the token embedding. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/spec/job_spec.h"

namespace stagecoach::spec {

// A llama-family model of `config` trained on windows of `seq` tokens: family llama, the
// decoder, and the fields gpt shares mirrored from it (vocab, d_model, layers, heads,
// tie_embeddings).
BuiltinModel LlamaBuiltin(hf::DecoderConfig config, int64_t seq);

// Whether the family is a decoder over tokens (gpt, llama).
bool IsDecoder(const BuiltinModel& model);

// A decoder's token embedding parameter, which a tied head shares: "embed.tok.weight" (gpt) or
// "embed.weight" (llama); empty for other families.
std::string TiedEmbeddingName(const BuiltinModel& model);

// The number of top-level layers of a built-in model, which `split` divides: mlp
// sizes.size() - 1 (0 with fewer than two sizes); gpt and llama layers + 3 (embed, the blocks,
// norm, head); 0 for an unknown family.
int64_t BuiltinLayerCount(const BuiltinModel& model);

// The ordered top-level layer names (the names `split.points` uses); empty for an unknown
// family.
std::vector<std::string> BuiltinLayerNames(const BuiltinModel& model);

// Whether `name` is one of BuiltinLayerNames(model), without listing them.
bool IsBuiltinLayerName(const BuiltinModel& model, absl::string_view name);

// The layer names for an error message: all of them, or the first and last few of a long list.
std::string DescribeBuiltinLayerNames(const BuiltinModel& model);

// Parameter count of each top-level layer, in layer order (mlp: weight and bias of each Linear;
// gpt: embed = token + position tables, each block, norm, head without bias; llama: embed, each
// decoder layer with its norms and the biases and q/k norms its configuration switches on, norm,
// head, which counts a tied head's copy too). INVALID_ARGUMENT naming model.builtin when a count
// does not fit in 64 bits.
absl::StatusOr<std::vector<int64_t>> BuiltinLayerParameterCounts(const BuiltinModel& model);

}  // namespace stagecoach::spec
