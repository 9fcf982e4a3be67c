#include "worker/model/llama.h"

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"
#include "worker/model/hf_weights.h"
#include "worker/model/layer_chain.h"
#include "worker/model/precision.h"

namespace stagecoach::model {
// Named after the file: the GPT and the Llama family both have an Embed, an Attention and a
// Norm, and a unity build may put both files in one translation unit.
namespace llama_layers {
namespace {

constexpr double kInitStd = 0.02;  // transformers' initializer_range

torch::nn::Linear MakeLinear(torch::nn::Module& owner, const std::string& name, int64_t in,
                             int64_t out, bool bias) {
  auto linear =
      owner.register_module(name, torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias)));
  torch::NoGradGuard no_grad;
  linear->weight.normal_(0.0, kInitStd);
  if (bias) linear->bias.zero_();
  return linear;
}

// transformers' RMSNorm: normalised in fp32, cast back to the input's dtype, then scaled.
torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  const torch::Tensor h = ToFloat32(x);
  const torch::Tensor normalised = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * normalised.to(x.scalar_type());
}

// An RMSNorm with its one parameter, "weight" (ones).
class RmsNormModule : public torch::nn::Module {
 public:
  RmsNormModule(int64_t size, double eps)
      : eps_(eps), weight_(register_parameter("weight", torch::ones({size}))) {}
  torch::Tensor forward(const torch::Tensor& x) { return RmsNorm(x, weight_, eps_); }

 private:
  double eps_;
  torch::Tensor weight_;
};

// The rotary embedding's inverse frequencies [head_dim / 2] in fp32, with the llama3 scaling
// when the configuration has one (as transformers computes them).
torch::Tensor InverseFrequencies(const hf::DecoderConfig& c) {
  const torch::Tensor exponent =
      torch::arange(0, c.head_dim, 2, torch::kInt64).to(torch::kFloat32) /
      static_cast<double>(c.head_dim);
  torch::Tensor inv = 1.0 / torch::pow(c.rope_theta, exponent);
  if (!c.rope_scaling.has_value()) return inv;
  const hf::Llama3RopeScaling& s = *c.rope_scaling;
  const double old_context = static_cast<double>(s.original_max_position_embeddings);
  const double low_freq_wavelen = old_context / s.low_freq_factor;
  const double high_freq_wavelen = old_context / s.high_freq_factor;
  const torch::Tensor wavelen = 2 * M_PI / inv;
  torch::Tensor scaled = torch::where(wavelen > low_freq_wavelen, inv / s.factor, inv);
  const torch::Tensor smooth =
      (old_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  const torch::Tensor smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
  const torch::Tensor medium = (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
  return torch::where(medium, smoothed, scaled);
}

// x rotated by the angles whose cosines and sines are `cos`, `sin` [T, head_dim]: the halves of
// the last dimension are the pairs (transformers' rotate_half).
torch::Tensor Rotate(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const torch::Tensor rotated = torch::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

class Embed : public ChainLayer {
 public:
  Embed(int64_t vocab, int64_t hidden, int64_t seq)
      : seq_(seq), weight_(register_parameter("weight", torch::empty({vocab, hidden}))) {
    torch::NoGradGuard no_grad;
    weight_.normal_(0.0, kInitStd);
  }

  torch::Tensor forward(const torch::Tensor& x) override {
    TORCH_CHECK(x.dim() == 2, "llama embed: expected token ids [batch, time], got ", x.sizes());
    TORCH_CHECK(x.scalar_type() == torch::kInt64, "llama embed: expected int64 token ids, got ",
                x.scalar_type());
    TORCH_CHECK(x.size(1) >= 1 && x.size(1) <= seq_, "llama embed: sequence length ", x.size(1),
                " is outside [1, model seq = ", seq_, "]");
    return torch::embedding(weight_, x);
  }

  // A decoding session's positions may go past seq, up to max_position_embeddings (the
  // session's bound, which the worker checks).
  torch::Tensor ForwardCached(const torch::Tensor& x, const DecodePositions& at,
                              LayerKv* kv) override {
    (void)at;
    (void)kv;
    TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kInt64,
                "llama embed: expected int64 token ids [rows, time], got ", x.sizes());
    return torch::embedding(weight_, x);
  }

  const torch::Tensor& weight() const { return weight_; }

 private:
  int64_t seq_;
  torch::Tensor weight_;
};

class Attention : public torch::nn::Module {
 public:
  explicit Attention(const hf::DecoderConfig& c)
      : heads_(c.num_attention_heads),
        kv_heads_(c.num_key_value_heads),
        head_dim_(c.head_dim),
        inv_freq_(InverseFrequencies(c)) {
    const int64_t h = c.hidden_size, q = heads_ * head_dim_, kv = kv_heads_ * head_dim_;
    q_proj_ = MakeLinear(*this, "q_proj", h, q, c.qkv_bias);
    k_proj_ = MakeLinear(*this, "k_proj", h, kv, c.qkv_bias);
    v_proj_ = MakeLinear(*this, "v_proj", h, kv, c.qkv_bias);
    o_proj_ = MakeLinear(*this, "o_proj", q, h, c.o_bias);
    if (c.qk_norm) {
      q_norm_ = register_module("q_norm", std::make_shared<RmsNormModule>(head_dim_, c.rms_norm_eps));
      k_norm_ = register_module("k_norm", std::make_shared<RmsNormModule>(head_dim_, c.rms_norm_eps));
    }
  }

  // Causal self-attention over x's positions 0 .. T-1; with `at` and `kv`, over the rows'
  // cached positions too, x being at at.positions (its keys and values added to the cache);
  // with `at` alone (packed rows), over x's positions at at.positions under at.hidden.
  torch::Tensor forward(const torch::Tensor& x, const DecodePositions* at = nullptr,
                        LayerKv* kv = nullptr) {
    const int64_t b = x.size(0), t = x.size(1);
    auto heads = [&](const torch::Tensor& y, int64_t n, RmsNormModule* norm) {
      torch::Tensor out = y.reshape({b, t, n, head_dim_});
      if (norm != nullptr) out = norm->forward(out);
      return out.transpose(1, 2);  // [B, n, T, hd]
    };
    torch::Tensor q = heads(q_proj_->forward(x), heads_, q_norm_.get());
    torch::Tensor k = heads(k_proj_->forward(x), kv_heads_, k_norm_.get());
    torch::Tensor v = heads(v_proj_->forward(x), kv_heads_, nullptr);
    // The rotation angles [T, hd], or [n, 1, T, hd] at a session's positions.
    const torch::Tensor positions =
        at != nullptr ? at->positions.to(torch::kFloat32)
                      : torch::arange(t, torch::TensorOptions(torch::kFloat32).device(x.device()));
    const torch::Tensor freqs = positions.unsqueeze(-1) * inv_freq_.to(x.device());
    torch::Tensor angles = torch::cat({freqs, freqs}, -1);
    if (at != nullptr) angles = angles.unsqueeze(1);
    const torch::Tensor cos = angles.cos(), sin = angles.sin();
    q = Rotate(q, cos, sin);
    k = Rotate(k, cos, sin);
    torch::Tensor hidden;
    if (kv != nullptr) std::tie(k, v) = kv->Append(k, v, *at);
    if (at != nullptr) {
      hidden = at->hidden;  // a session's cached positions, or packed rows' documents
    } else {
      hidden = torch::ones({t, t}, torch::TensorOptions(torch::kBool).device(x.device())).triu(1);
    }
    if (kv_heads_ != heads_) {
      k = k.repeat_interleave(heads_ / kv_heads_, 1);
      v = v.repeat_interleave(heads_ / kv_heads_, 1);
    }
    torch::Tensor scores =
        torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim_));
    scores = scores.masked_fill(hidden, -std::numeric_limits<float>::infinity());
    const torch::Tensor weights = torch::softmax(ToFloat32(scores), -1);
    const torch::Tensor y = torch::matmul(weights, v).transpose(1, 2).reshape({b, t, heads_ * head_dim_});
    return o_proj_->forward(y);
  }

 private:
  int64_t heads_, kv_heads_, head_dim_;
  torch::Tensor inv_freq_;  // not a parameter: a constant of the configuration
  torch::nn::Linear q_proj_{nullptr}, k_proj_{nullptr}, v_proj_{nullptr}, o_proj_{nullptr};
  std::shared_ptr<RmsNormModule> q_norm_, k_norm_;
};

class Mlp : public torch::nn::Module {
 public:
  explicit Mlp(const hf::DecoderConfig& c) {
    gate_proj_ = MakeLinear(*this, "gate_proj", c.hidden_size, c.intermediate_size, c.mlp_bias);
    up_proj_ = MakeLinear(*this, "up_proj", c.hidden_size, c.intermediate_size, c.mlp_bias);
    down_proj_ = MakeLinear(*this, "down_proj", c.intermediate_size, c.hidden_size, c.mlp_bias);
  }

  torch::Tensor forward(const torch::Tensor& x) {
    return down_proj_->forward(torch::silu(gate_proj_->forward(x)) * up_proj_->forward(x));
  }

 private:
  torch::nn::Linear gate_proj_{nullptr}, up_proj_{nullptr}, down_proj_{nullptr};
};

class DecoderLayer : public ChainLayer {
 public:
  explicit DecoderLayer(const hf::DecoderConfig& c) {
    input_norm_ = register_module("input_layernorm",
                                  std::make_shared<RmsNormModule>(c.hidden_size, c.rms_norm_eps));
    attn_ = register_module("self_attn", std::make_shared<Attention>(c));
    post_norm_ = register_module("post_attention_layernorm",
                                 std::make_shared<RmsNormModule>(c.hidden_size, c.rms_norm_eps));
    mlp_ = register_module("mlp", std::make_shared<Mlp>(c));
  }

  torch::Tensor forward(const torch::Tensor& x) override {
    const torch::Tensor h = x + attn_->forward(input_norm_->forward(x));
    return h + mlp_->forward(post_norm_->forward(h));
  }

  torch::Tensor ForwardCached(const torch::Tensor& x, const DecodePositions& at,
                              LayerKv* kv) override {
    const torch::Tensor h = x + attn_->forward(input_norm_->forward(x), &at, kv);
    return h + mlp_->forward(post_norm_->forward(h));
  }

 private:
  std::shared_ptr<RmsNormModule> input_norm_;
  std::shared_ptr<Attention> attn_;
  std::shared_ptr<RmsNormModule> post_norm_;
  std::shared_ptr<Mlp> mlp_;
};

class Norm : public ChainLayer {
 public:
  Norm(int64_t hidden, double eps)
      : eps_(eps), weight_(register_parameter("weight", torch::ones({hidden}))) {}

  torch::Tensor forward(const torch::Tensor& x) override { return RmsNorm(x, weight_, eps_); }

 private:
  double eps_;
  torch::Tensor weight_;
};

}  // namespace
}  // namespace llama_layers

absl::StatusOr<std::unique_ptr<StageModel>> BuildLlamaStage(const spec::BuiltinModel& model,
                                                            int first_layer, int end_layer) {
  if (model.family != "llama" || !model.decoder.has_value()) {
    return absl::InvalidArgumentError("model.builtin.family: not a llama-family model");
  }
  const hf::DecoderConfig& c = *model.decoder;
  if (model.seq <= 0 || model.seq > c.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("model.builtin.seq: must be in [1, ",
                                                   c.max_position_embeddings, "], got ", model.seq));
  }
  const int64_t n = c.num_hidden_layers;
  const int64_t layers = n + 3;
  if (first_layer < 0 || end_layer > layers || first_layer >= end_layer) {
    return absl::InvalidArgumentError(absl::StrCat("stage layers [", first_layer, ", ", end_layer,
                                                   ") are outside the model's ", layers, " layers"));
  }
  // Weights from a checkpoint directory: only the stage's layers are built; their initial
  // draws are overwritten. From a seed: every layer up to the stage's, in order.
  const bool from_files = !model.weights_dir.empty();
  std::vector<std::pair<std::string, std::shared_ptr<ChainLayer>>> kept;
  std::unique_lock<std::mutex> lock(SeedMutex());
  torch::manual_seed(model.seed);
  std::shared_ptr<llama_layers::Embed> embed;
  for (int64_t i = from_files ? first_layer : 0; i < end_layer; ++i) {
    std::string name;
    std::shared_ptr<ChainLayer> layer;
    if (i == 0) {
      name = "embed";
      embed = std::make_shared<llama_layers::Embed>(c.vocab_size, c.hidden_size, model.seq);
      layer = embed;
    } else if (i <= n) {
      name = absl::StrCat("layers.", i - 1);
      layer = std::make_shared<llama_layers::DecoderLayer>(c);
    } else if (i == n + 1) {
      name = "norm";
      layer = std::make_shared<llama_layers::Norm>(c.hidden_size, c.rms_norm_eps);
    } else {
      name = "head";
      if (!c.tie_word_embeddings || (from_files && first_layer > 0)) {
        layer = std::make_shared<OutputHead>(c.hidden_size, c.vocab_size, llama_layers::kInitStd);
      } else if (first_layer == 0) {
        layer = OutputHead::Sharing(embed->weight());
      } else {
        layer = OutputHead::Copying(embed->weight());
      }
    }
    if (i >= first_layer) kept.emplace_back(std::move(name), std::move(layer));
  }
  lock.unlock();
  auto stage = std::make_unique<LayerChainStage>(std::move(kept));
  if (from_files) {
    RETURN_IF_ERROR(LoadHfWeights(model.weights_dir, c.tie_word_embeddings, *stage));
  }
  return std::unique_ptr<StageModel>(std::move(stage));
}

}  // namespace stagecoach::model
