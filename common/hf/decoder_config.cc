#include "common/hf/decoder_config.h"

#include <cmath>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace stagecoach::hf {
namespace {

using nlohmann::json;

// transformers' defaults for what a config.json leaves out, by model_type.
struct Defaults {
  int64_t vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads;
  int64_t num_key_value_heads;  // 0: num_attention_heads
  int64_t head_dim;             // 0: hidden_size / num_attention_heads
  int64_t max_position_embeddings;
  std::optional<int64_t> sliding_window;  // mistral's
  const char* architecture;
};

std::optional<Defaults> DefaultsFor(const std::string& model_type) {
  if (model_type == "llama") {
    return Defaults{32000, 4096, 11008, 32, 32, 0, 0, 2048, std::nullopt, "LlamaForCausalLM"};
  }
  if (model_type == "mistral") {
    return Defaults{32000, 4096, 14336, 32, 32, 8, 0, 4096 * 32, 4096, "MistralForCausalLM"};
  }
  if (model_type == "qwen2") {
    return Defaults{151936, 4096, 22016, 32, 32, 0, 0, 32768, std::nullopt, "Qwen2ForCausalLM"};
  }
  if (model_type == "qwen3") {
    return Defaults{151936, 4096, 22016, 32, 32, 0, 128, 32768, std::nullopt, "Qwen3ForCausalLM"};
  }
  return std::nullopt;
}

class Reader {
 public:
  Reader(const json& root, absl::string_view file_name) : root_(root), file_name_(file_name) {}

  absl::Status Error(absl::string_view key, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(file_name_, ": ", key, " ", what));
  }
  bool Has(const char* key) const {
    const auto it = root_.find(key);
    return it != root_.end() && !it->is_null();
  }

  // A positive integer `key`, or `fallback` when absent (or null).
  absl::StatusOr<int64_t> Positive(const char* key, int64_t fallback) const {
    if (!Has(key)) return fallback;
    const json& v = root_.at(key);
    if (!v.is_number_integer() || v.get<int64_t>() <= 0) {
      return Error(key, absl::StrCat("is ", v.dump(), ", not a positive integer"));
    }
    return v.get<int64_t>();
  }
  absl::StatusOr<double> PositiveReal(const json& object, const char* key, double fallback,
                                      absl::string_view where) const {
    const auto it = object.find(key);
    if (it == object.end() || it->is_null()) return fallback;
    if (!it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() <= 0) {
      return Error(absl::StrCat(where, key), absl::StrCat("is ", it->dump(),
                                                          ", not a positive number"));
    }
    return it->get<double>();
  }
  absl::StatusOr<bool> Bool(const char* key, bool fallback) const {
    if (!Has(key)) return fallback;
    if (!root_.at(key).is_boolean()) {
      return Error(key, absl::StrCat("is ", root_.at(key).dump(), ", not true or false"));
    }
    return root_.at(key).get<bool>();
  }
  std::optional<int64_t> OptionalInteger(const char* key) const {
    if (!Has(key) || !root_.at(key).is_number_integer()) return std::nullopt;
    return root_.at(key).get<int64_t>();
  }

  absl::StatusOr<std::optional<Llama3RopeScaling>> RopeScaling() const {
    if (!Has("rope_scaling")) return std::optional<Llama3RopeScaling>();
    const json& v = root_.at("rope_scaling");
    if (!v.is_object()) return Error("rope_scaling", "is not an object or null");
    std::string type;
    for (const char* key : {"rope_type", "type"}) {
      if (v.contains(key) && v.at(key).is_string()) type = v.at(key).get<std::string>();
    }
    if (type == "default") return std::optional<Llama3RopeScaling>();
    if (type != "llama3") {
      return Error("rope_scaling", absl::StrCat("of type '", type,
                                                "' is not supported (llama3 or default)"));
    }
    Llama3RopeScaling s;
    auto factor = PositiveReal(v, "factor", s.factor, "rope_scaling.");
    auto low = PositiveReal(v, "low_freq_factor", s.low_freq_factor, "rope_scaling.");
    auto high = PositiveReal(v, "high_freq_factor", s.high_freq_factor, "rope_scaling.");
    auto original = PositiveReal(v, "original_max_position_embeddings",
                                 static_cast<double>(s.original_max_position_embeddings),
                                 "rope_scaling.");
    for (const auto* r : {&factor, &low, &high, &original}) {
      if (!r->ok()) return r->status();
    }
    if (*high <= *low) {
      return Error("rope_scaling.high_freq_factor",
                   absl::StrCat(*high, " is not above low_freq_factor ", *low));
    }
    s.factor = *factor;
    s.low_freq_factor = *low;
    s.high_freq_factor = *high;
    s.original_max_position_embeddings = static_cast<int64_t>(*original);
    return std::optional<Llama3RopeScaling>(s);
  }

 private:
  const json& root_;
  absl::string_view file_name_;
};

absl::Status ReadSizes(const Reader& r, const Defaults& d, DecoderConfig& c) {
  struct Field {
    const char* key;
    int64_t* out;
    int64_t fallback;
  };
  for (const Field& f : {Field{"vocab_size", &c.vocab_size, d.vocab_size},
                         Field{"hidden_size", &c.hidden_size, d.hidden_size},
                         Field{"intermediate_size", &c.intermediate_size, d.intermediate_size},
                         Field{"num_hidden_layers", &c.num_hidden_layers, d.num_hidden_layers},
                         Field{"num_attention_heads", &c.num_attention_heads,
                               d.num_attention_heads},
                         Field{"max_position_embeddings", &c.max_position_embeddings,
                               d.max_position_embeddings}}) {
    absl::StatusOr<int64_t> v = r.Positive(f.key, f.fallback);
    if (!v.ok()) return v.status();
    *f.out = *v;
  }
  absl::StatusOr<int64_t> kv = r.Positive(
      "num_key_value_heads", d.num_key_value_heads > 0 ? d.num_key_value_heads
                                                       : c.num_attention_heads);
  if (!kv.ok()) return kv.status();
  c.num_key_value_heads = *kv;
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return r.Error("num_key_value_heads", absl::StrCat(c.num_key_value_heads,
                                                       " does not divide num_attention_heads ",
                                                       c.num_attention_heads));
  }
  if (!r.Has("head_dim") && d.head_dim == 0 && c.hidden_size % c.num_attention_heads != 0) {
    return r.Error("num_attention_heads",
                   absl::StrCat(c.num_attention_heads, " does not divide hidden_size ",
                                c.hidden_size, " (and there is no head_dim)"));
  }
  absl::StatusOr<int64_t> head_dim = r.Positive(
      "head_dim", d.head_dim > 0 ? d.head_dim : c.hidden_size / c.num_attention_heads);
  if (!head_dim.ok()) return head_dim.status();
  c.head_dim = *head_dim;
  if (c.head_dim % 2 != 0) {
    return r.Error("head_dim", absl::StrCat(c.head_dim, " is odd: rotary embeddings rotate "
                                                        "pairs of dimensions"));
  }
  return absl::OkStatus();
}

absl::Status ReadSwitches(const Reader& r, const json& root, DecoderConfig& c) {
  const std::string& type = c.model_type;
  absl::StatusOr<bool> tie = r.Bool("tie_word_embeddings", false);
  absl::StatusOr<bool> attention_bias = r.Bool("attention_bias", false);
  absl::StatusOr<bool> mlp_bias = r.Bool("mlp_bias", false);
  absl::StatusOr<bool> use_sliding = r.Bool("use_sliding_window", false);
  for (const auto* s : {&tie, &attention_bias, &mlp_bias, &use_sliding}) {
    if (!s->ok()) return s->status();
  }
  c.tie_word_embeddings = *tie;
  c.qkv_bias = type == "qwen2" || ((type == "llama" || type == "qwen3") && *attention_bias);
  c.o_bias = (type == "llama" || type == "qwen3") && *attention_bias;
  c.mlp_bias = type == "llama" && *mlp_bias;
  c.qk_norm = type == "qwen3";
  if ((type == "qwen2" || type == "qwen3") && *use_sliding) {
    return r.Error("use_sliding_window", "is true: sliding-window attention is not supported");
  }
  if (type == "mistral") {
    const auto it = root.find("sliding_window");
    if (it == root.end()) {
      c.sliding_window = 4096;  // MistralConfig's default
    } else if (!it->is_null()) {
      if (!it->is_number_integer() || it->get<int64_t>() <= 0) {
        return r.Error("sliding_window", absl::StrCat("is ", it->dump(),
                                                      ", not a positive integer or null"));
      }
      c.sliding_window = it->get<int64_t>();
    }
  }
  const auto act = root.find("hidden_act");
  if (act != root.end() && !act->is_null() && *act != "silu") {
    return r.Error("hidden_act", absl::StrCat("is ", act->dump(), ": only silu (SwiGLU) is supported"));
  }
  return absl::OkStatus();
}

}  // namespace

int64_t DecoderConfig::NumParameters() const {
  const int64_t h = hidden_size, q = num_attention_heads * head_dim,
                kv = num_key_value_heads * head_dim;
  int64_t layer = h * q + 2 * h * kv + q * h + 3 * h * intermediate_size + 2 * h;
  if (qkv_bias) layer += q + 2 * kv;
  if (o_bias) layer += h;
  if (mlp_bias) layer += 2 * intermediate_size + h;
  if (qk_norm) layer += 2 * head_dim;
  int64_t total = vocab_size * h + num_hidden_layers * layer + h;
  if (!tie_word_embeddings) total += vocab_size * h;
  return total;
}

absl::StatusOr<DecoderConfig> ParseDecoderConfig(absl::string_view text,
                                                 absl::string_view file_name) {
  const json root = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(file_name, ": not a JSON object"));
  }
  Reader r(root, file_name);
  const auto type = root.find("model_type");
  if (type == root.end() || !type->is_string()) {
    return r.Error("model_type", "is missing (llama, mistral, qwen2 or qwen3)");
  }
  DecoderConfig c;
  c.model_type = type->get<std::string>();
  const std::optional<Defaults> defaults = DefaultsFor(c.model_type);
  if (!defaults) {
    return r.Error("model_type", absl::StrCat("'", c.model_type,
                                              "' is not supported (llama, mistral, qwen2 or "
                                              "qwen3)"));
  }
  if (absl::Status s = ReadSizes(r, *defaults, c); !s.ok()) return s;
  absl::StatusOr<double> eps = r.PositiveReal(root, "rms_norm_eps", 1e-6, "");
  if (!eps.ok()) return eps.status();
  c.rms_norm_eps = *eps;
  absl::StatusOr<double> theta = r.PositiveReal(root, "rope_theta", 10000.0, "");
  if (!theta.ok()) return theta.status();
  c.rope_theta = *theta;
  absl::StatusOr<std::optional<Llama3RopeScaling>> scaling = r.RopeScaling();
  if (!scaling.ok()) return scaling.status();
  c.rope_scaling = *scaling;
  if (absl::Status s = ReadSwitches(r, root, c); !s.ok()) return s;
  if (r.Has("torch_dtype") && root.at("torch_dtype").is_string()) {
    c.torch_dtype = root.at("torch_dtype").get<std::string>();
  }
  c.bos_token_id = r.OptionalInteger("bos_token_id");
  c.eos_token_id = r.OptionalInteger("eos_token_id");
  return c;
}

std::string DecoderConfigJson(const DecoderConfig& c) {
  const std::optional<Defaults> defaults = DefaultsFor(c.model_type);
  json out = json::object();
  out["architectures"] = {defaults ? defaults->architecture : "LlamaForCausalLM"};
  out["model_type"] = c.model_type;
  out["vocab_size"] = c.vocab_size;
  out["hidden_size"] = c.hidden_size;
  out["intermediate_size"] = c.intermediate_size;
  out["num_hidden_layers"] = c.num_hidden_layers;
  out["num_attention_heads"] = c.num_attention_heads;
  out["num_key_value_heads"] = c.num_key_value_heads;
  out["head_dim"] = c.head_dim;
  out["max_position_embeddings"] = c.max_position_embeddings;
  out["rms_norm_eps"] = c.rms_norm_eps;
  out["rope_theta"] = c.rope_theta;
  out["hidden_act"] = "silu";
  out["tie_word_embeddings"] = c.tie_word_embeddings;
  if (c.rope_scaling) {
    out["rope_scaling"] = {
        {"rope_type", "llama3"},
        {"factor", c.rope_scaling->factor},
        {"low_freq_factor", c.rope_scaling->low_freq_factor},
        {"high_freq_factor", c.rope_scaling->high_freq_factor},
        {"original_max_position_embeddings", c.rope_scaling->original_max_position_embeddings}};
  } else {
    out["rope_scaling"] = nullptr;
  }
  if (c.model_type == "llama") out["mlp_bias"] = c.mlp_bias;
  if (c.model_type == "llama" || c.model_type == "qwen3") out["attention_bias"] = c.o_bias;
  if (c.model_type == "mistral") {
    out["sliding_window"] = c.sliding_window ? json(*c.sliding_window) : json(nullptr);
  }
  if (c.model_type == "qwen2" || c.model_type == "qwen3") out["use_sliding_window"] = false;
  if (!c.torch_dtype.empty()) out["torch_dtype"] = c.torch_dtype;
  if (c.bos_token_id) out["bos_token_id"] = *c.bos_token_id;
  if (c.eos_token_id) out["eos_token_id"] = *c.eos_token_id;
  return out.dump(2) + "\n";
}

}  // namespace stagecoach::hf
