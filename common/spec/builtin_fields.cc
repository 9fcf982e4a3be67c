#include "common/spec/builtin_fields.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/hf/decoder_config.h"
#include "common/spec/builtin_model.h"

namespace stagecoach::spec::builtin_fields {
namespace {

using json = nlohmann::json;
using yaml_fields::Describe;
using yaml_fields::Fields;
using yaml_fields::PeekScalar;
using yaml_fields::Read;
using yaml_fields::Validator;

constexpr int64_t kIntMax = std::numeric_limits<int>::max();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr char kPath[] = "model.builtin";

const std::vector<std::string>& MlpKeys() {
  static const auto* keys = new std::vector<std::string>{"family", "sizes", "seed"};
  return *keys;
}
const std::vector<std::string>& GptKeys() {
  static const auto* keys = new std::vector<std::string>{
      "family", "vocab", "d_model", "layers", "heads", "seq", "seed", "tie_embeddings"};
  return *keys;
}
// The llama family's keys besides family, seq and seed: Hugging Face's config.json names.
const std::vector<std::string>& LlamaConfigKeys() {
  static const auto* keys = new std::vector<std::string>{
      "model_type",          "vocab_size",          "hidden_size",
      "intermediate_size",   "num_hidden_layers",   "num_attention_heads",
      "num_key_value_heads", "head_dim",            "max_position_embeddings",
      "rms_norm_eps",        "rope_theta",          "rope_scaling",
      "tie_word_embeddings", "attention_bias",      "mlp_bias"};
  return *keys;
}

// `keys` that are not in `own`, each "not a key of family F".
std::vector<std::pair<std::string, std::string>> Foreign(const std::vector<std::string>& keys,
                                                         const std::vector<std::string>& own,
                                                         const std::string& family) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& key : keys) {
    if (std::find(own.begin(), own.end(), key) != own.end()) continue;
    out.emplace_back(key, absl::StrCat("not a key of family ", family));
  }
  return out;
}

std::vector<std::string> WithCommon(const std::vector<std::string>& keys) {
  std::vector<std::string> out = {"family", "seq", "seed"};
  out.insert(out.end(), keys.begin(), keys.end());
  return out;
}

void ParseMlpSizes(Validator& v, const Fields& fields, BuiltinModel* builtin) {
  const std::string path = fields.Path("sizes");
  if (!fields.Has("sizes")) {
    v.Error(path, "required for family mlp");
    return;
  }
  const YAML::Node sizes = fields.Get("sizes");
  if (!sizes.IsSequence()) {
    v.Error(path, absl::StrCat("must be a list of at least 2 integers, got ", Describe(sizes)));
    return;
  }
  if (sizes.size() < 2) {
    v.Error(path, absl::StrCat("must be a list of at least 2 integers, got ", sizes.size(),
                               sizes.size() == 1 ? " item" : " items"));
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (auto size = v.Int(sizes[i], absl::StrCat(path, "[", i, "]"), 1, kInt64Max)) {
      builtin->sizes.push_back(*size);
    }
  }
}

void ParseGpt(Validator& v, const Fields& fields, BuiltinModel* builtin) {
  bool all_ok = true;
  const std::pair<const char*, int64_t*> dims[] = {{"vocab", &builtin->vocab},
                                                   {"d_model", &builtin->d_model},
                                                   {"layers", &builtin->layers},
                                                   {"heads", &builtin->heads},
                                                   {"seq", &builtin->seq}};
  for (const auto& [key, out] : dims) {
    const Read read = fields.Int(key, 1, kIntMax, out);
    if (read == Read::kAbsent) v.Error(fields.Path(key), "required for family gpt");
    all_ok = all_ok && read == Read::kOk;
  }
  fields.Bool("tie_embeddings", &builtin->tie_embeddings);
  if (all_ok && builtin->d_model % builtin->heads != 0) {
    v.Error(fields.Path("d_model"),
            absl::StrCat("must be divisible by model.builtin.heads (", builtin->heads, "), got ",
                         builtin->d_model));
  }
}

// rope_scaling: {rope_type: llama3 | default, factor, low_freq_factor, high_freq_factor (numbers
// > 0), original_max_position_embeddings (integer >= 1)}, as a config.json value.
std::optional<json> RopeScaling(Validator& v, const Fields& fields) {
  auto scaling = v.Open(fields.Get("rope_scaling"), fields.Path("rope_scaling"),
                        {"rope_type", "factor", "low_freq_factor", "high_freq_factor",
                         "original_max_position_embeddings"});
  if (!scaling) return std::nullopt;
  json out = json::object();
  std::string type;
  if (scaling->Enum("rope_type", {"llama3", "default"}, &type) == Read::kAbsent) {
    v.Error(scaling->Path("rope_type"), "required (llama3 or default)");
    return std::nullopt;
  }
  out["rope_type"] = type;
  for (const char* key : {"factor", "low_freq_factor", "high_freq_factor"}) {
    double value = 0;
    if (scaling->Number(key, &value) != Read::kOk) continue;
    if (value <= 0) {
      v.Error(scaling->Path(key), absl::StrCat("must be > 0, got ", value));
      continue;
    }
    out[key] = value;
  }
  int64_t original = 0;
  if (scaling->Int("original_max_position_embeddings", 1, kIntMax, &original) == Read::kOk) {
    out["original_max_position_embeddings"] = original;
  }
  return out;
}

// The llama family: its keys become a config.json object that hf::ParseDecoderConfig reads,
// so the defaults per model_type and the checks between keys are the file's.
void ParseLlama(Validator& v, const Fields& fields, BuiltinModel* builtin) {
  const size_t errors_before = v.error_count();
  json config = json::object();
  std::string model_type = "llama";
  fields.Enum("model_type", {"llama", "mistral", "qwen2", "qwen3"}, &model_type);
  config["model_type"] = model_type;
  for (const char* key : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads", "num_key_value_heads", "head_dim",
                          "max_position_embeddings", "seq"}) {
    int64_t value = 0;
    const Read read = fields.Int(key, 1, kIntMax, &value);
    const absl::string_view name = key;
    const bool optional = name == "num_key_value_heads" || name == "head_dim" ||
                          name == "max_position_embeddings";
    if (read == Read::kAbsent && !optional) v.Error(fields.Path(key), "required for family llama");
    if (read != Read::kOk) continue;
    if (name == "seq") {
      builtin->seq = value;
    } else {
      config[key] = value;
    }
  }
  for (const char* key : {"rms_norm_eps", "rope_theta"}) {
    double value = 0;
    if (fields.Number(key, &value) != Read::kOk) continue;
    if (value <= 0) {
      v.Error(fields.Path(key), absl::StrCat("must be > 0, got ", value));
      continue;
    }
    config[key] = value;
  }
  for (const char* key : {"tie_word_embeddings", "attention_bias", "mlp_bias"}) {
    bool value = false;
    if (fields.Bool(key, &value) != Read::kOk) continue;
    // transformers' configuration classes of these types have no such key: refused rather than
    // ignored as config.json's reader ignores it.
    const absl::string_view name = key;
    const bool foreign = (name == "mlp_bias" && model_type != "llama") ||
                         (name == "attention_bias" &&
                          (model_type == "mistral" || model_type == "qwen2"));
    if (foreign) {
      v.Error(fields.Path(key),
              absl::StrCat("not a key of model_type ", model_type,
                           name == "mlp_bias" ? " (its MLP has no biases)"
                           : model_type == "qwen2"
                               ? " (q, k and v always have biases, o none)"
                               : " (its attention has no biases)"));
      continue;
    }
    config[key] = value;
  }
  if (fields.Has("rope_scaling")) {
    if (std::optional<json> scaling = RopeScaling(v, fields)) config["rope_scaling"] = *scaling;
  }
  if (v.error_count() != errors_before) return;
  if (!config.contains("max_position_embeddings")) {
    config["max_position_embeddings"] = builtin->seq;
  }
  absl::StatusOr<hf::DecoderConfig> decoder = hf::ParseDecoderConfig(config.dump(), kPath);
  if (!decoder.ok()) {
    // "model.builtin: <key> <what>": the key is the spec's.
    absl::string_view message = decoder.status().message();
    absl::ConsumePrefix(&message, absl::StrCat(kPath, ": "));
    v.Error(kPath, std::string(message));
    return;
  }
  if (builtin->seq > decoder->max_position_embeddings) {
    v.Error(fields.Path("seq"),
            absl::StrCat("must be <= max_position_embeddings (", decoder->max_position_embeddings,
                         "), got ", builtin->seq));
    return;
  }
  const uint64_t seed = builtin->seed;
  *builtin = LlamaBuiltin(*std::move(decoder), builtin->seq);
  builtin->seed = seed;
}

}  // namespace

void ParseBuiltin(Validator& v, const YAML::Node& node, BuiltinModel* builtin) {
  const std::vector<std::string> llama_keys = WithCommon(LlamaConfigKeys());
  std::vector<std::string> all_keys = {"sizes", "vocab", "d_model", "layers", "heads",
                                       "tie_embeddings"};
  all_keys = WithCommon(all_keys);
  all_keys.insert(all_keys.end(), LlamaConfigKeys().begin(), LlamaConfigKeys().end());
  const std::string family = PeekScalar(node, "family");
  std::optional<Fields> fields;
  if (family == "mlp") {
    fields = v.Open(node, kPath, MlpKeys(), Foreign(all_keys, MlpKeys(), family));
  } else if (family == "gpt") {
    fields = v.Open(node, kPath, GptKeys(), Foreign(all_keys, GptKeys(), family));
  } else if (family == "llama") {
    fields = v.Open(node, kPath, llama_keys, Foreign(all_keys, llama_keys, family));
  } else {
    fields = v.Open(node, kPath, all_keys);
  }
  if (!fields) return;

  if (fields->Enum("family", {"mlp", "gpt", "llama"}, &builtin->family) == Read::kAbsent) {
    v.Error(fields->Path("family"), "required (mlp, gpt or llama)");
  }
  fields->Uint("seed", &builtin->seed);
  if (builtin->family == "mlp") {
    ParseMlpSizes(v, *fields, builtin);
  } else if (builtin->family == "gpt") {
    ParseGpt(v, *fields, builtin);
  } else if (builtin->family == "llama") {
    ParseLlama(v, *fields, builtin);
  }
}

}  // namespace stagecoach::spec::builtin_fields
