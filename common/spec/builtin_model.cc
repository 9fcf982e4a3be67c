#include "common/spec/builtin_model.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/util/checked_math.h"

namespace stagecoach::spec {
namespace {

// The prefix of a decoder's block names.
const char* BlockPrefix(const BuiltinModel& model) {
  return model.family == "llama" ? "layers." : "blocks.";
}

// The name of layer `i` of a built-in model (0 <= i < BuiltinLayerCount).
std::string LayerName(const BuiltinModel& model, int64_t i) {
  if (model.family == "mlp") return absl::StrCat(i);
  if (i == 0) return "embed";
  if (i <= model.layers) return absl::StrCat(BlockPrefix(model), i - 1);
  return i == model.layers + 1 ? "norm" : "head";
}

absl::Status Overflow(const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat("model.builtin: the parameter count of ", what, " does not fit in 64 bits"));
}

// One decoder layer of a llama-family model: attention (q, k, v, o and the biases and per-head
// q/k norms the configuration switches on), the SwiGLU MLP, and its two RMSNorms.
absl::StatusOr<int64_t> LlamaLayerParameters(const hf::DecoderConfig& c) {
  const int64_t h = c.hidden_size;
  int64_t q = 0, kv = 0, attn = 0, mlp = 0, layer = 0;
  bool ok = CheckedMulAdd(c.num_attention_heads, c.head_dim, 0, &q) &&
            CheckedMulAdd(c.num_key_value_heads, c.head_dim, 0, &kv) &&
            CheckedMulAdd(2, kv, q, &attn) &&           // q, k, v outputs
            CheckedMulAdd(attn, h, 0, &attn) &&         // q, k, v weights
            CheckedMulAdd(q, h, attn, &attn) &&         // o weight
            CheckedMulAdd(3 * h, c.intermediate_size, 0, &mlp) &&
            !__builtin_add_overflow(attn, mlp, &layer) && CheckedMulAdd(2, h, layer, &layer);
  if (ok && c.qkv_bias) ok = CheckedMulAdd(2, kv, q, &q) && !__builtin_add_overflow(layer, q, &layer);
  if (ok && c.o_bias) ok = !__builtin_add_overflow(layer, h, &layer);
  if (ok && c.mlp_bias) ok = CheckedMulAdd(2, c.intermediate_size, h + layer, &layer);
  if (ok && c.qk_norm) ok = CheckedMulAdd(2, c.head_dim, layer, &layer);
  if (!ok) return Overflow("a decoder layer");
  return layer;
}

}  // namespace

BuiltinModel LlamaBuiltin(hf::DecoderConfig config, int64_t seq) {
  BuiltinModel out;
  out.family = "llama";
  out.seq = seq;
  out.vocab = config.vocab_size;
  out.d_model = config.hidden_size;
  out.layers = config.num_hidden_layers;
  out.heads = config.num_attention_heads;
  out.tie_embeddings = config.tie_word_embeddings;
  out.decoder = std::move(config);
  return out;
}

bool IsDecoder(const BuiltinModel& model) {
  return model.family == "gpt" || model.family == "llama";
}

std::string TiedEmbeddingName(const BuiltinModel& model) {
  if (model.family == "gpt") return "embed.tok.weight";
  if (model.family == "llama") return "embed.weight";
  return "";
}

int64_t BuiltinLayerCount(const BuiltinModel& model) {
  if (model.family == "mlp") {
    return model.sizes.size() < 2 ? 0 : static_cast<int64_t>(model.sizes.size()) - 1;
  }
  if (IsDecoder(model)) return model.layers + 3;
  return 0;
}

std::vector<std::string> BuiltinLayerNames(const BuiltinModel& model) {
  std::vector<std::string> names;
  const int64_t count = BuiltinLayerCount(model);
  names.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) names.push_back(LayerName(model, i));
  return names;
}

bool IsBuiltinLayerName(const BuiltinModel& model, absl::string_view name) {
  auto index_below = [](absl::string_view digits, int64_t limit) {
    int64_t index = 0;
    if (digits.empty() || (digits.size() > 1 && digits[0] == '0')) return false;
    if (!std::all_of(digits.begin(), digits.end(),
                     [](char c) { return absl::ascii_isdigit(static_cast<unsigned char>(c)); })) {
      return false;
    }
    return absl::SimpleAtoi(digits, &index) && index < limit;
  };
  if (model.family == "mlp") return index_below(name, BuiltinLayerCount(model));
  if (!IsDecoder(model)) return false;
  if (name == "embed" || name == "norm" || name == "head") return true;
  return absl::ConsumePrefix(&name, BlockPrefix(model)) && index_below(name, model.layers);
}

std::string DescribeBuiltinLayerNames(const BuiltinModel& model) {
  constexpr int64_t kHead = 5, kTail = 3;
  const int64_t count = BuiltinLayerCount(model);
  std::vector<std::string> shown;
  for (int64_t i = 0; i < count; ++i) {
    if (count > kHead + kTail + 2 && i == kHead) {
      shown.push_back("...");
      i = count - kTail;
    }
    shown.push_back(LayerName(model, i));
  }
  return absl::StrJoin(shown, ", ");
}

absl::StatusOr<std::vector<int64_t>> BuiltinLayerParameterCounts(const BuiltinModel& model) {
  std::vector<int64_t> out;
  if (model.family == "mlp") {
    for (size_t i = 0; i + 1 < model.sizes.size(); ++i) {
      int64_t n = 0;  // weight and bias
      if (!CheckedMulAdd(model.sizes[i], model.sizes[i + 1], model.sizes[i + 1], &n)) {
        return Overflow(absl::StrCat("layer ", i));
      }
      out.push_back(n);
    }
  } else if (model.family == "gpt") {
    const int64_t d = model.d_model;
    int64_t tokens = 0, embed = 0, d2 = 0, block = 0, head = 0;
    // embed: token and position tables.
    if (!CheckedMulAdd(model.vocab, d, 0, &tokens) || !CheckedMulAdd(model.seq, d, tokens, &embed)) {
      return Overflow("embed");
    }
    out.push_back(embed);
    // A block: ln1 (2d), attn.qkv (3d*d + 3d), attn.proj (d*d + d), ln2 (2d), mlp.fc
    // (4d*d + 4d), mlp.proj (4d*d + d).
    int64_t thirteen_d = 0;
    if (!CheckedMulAdd(d, d, 0, &d2) || !CheckedMulAdd(13, d, 0, &thirteen_d) ||
        !CheckedMulAdd(12, d2, thirteen_d, &block)) {
      return Overflow("a block");
    }
    // The layer count is checked against max_layers before anything sized by it is built.
    if (model.layers > 0) out.insert(out.end(), static_cast<size_t>(model.layers), block);
    out.push_back(2 * d);  // norm (d <= 2^31 by the parser)
    if (!CheckedMulAdd(d, model.vocab, 0, &head)) return Overflow("head");
    out.push_back(head);  // no bias
  } else if (model.family == "llama" && model.decoder.has_value()) {
    const hf::DecoderConfig& c = *model.decoder;
    int64_t table = 0;
    if (!CheckedMulAdd(c.vocab_size, c.hidden_size, 0, &table)) return Overflow("embed");
    absl::StatusOr<int64_t> layer = LlamaLayerParameters(c);
    if (!layer.ok()) return layer.status();
    out.push_back(table);
    if (c.num_hidden_layers > 0) {
      out.insert(out.end(), static_cast<size_t>(c.num_hidden_layers), *layer);
    }
    out.push_back(c.hidden_size);  // RMSNorm: a weight, no bias
    out.push_back(table);
  }
  return out;
}

}  // namespace stagecoach::spec
