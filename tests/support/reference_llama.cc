#include "tests/support/reference_llama.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <memory>

#include "absl/strings/str_cat.h"
#include "tests/support/reference_common.h"

namespace stagecoach::testing {
namespace {

class Llama {
 public:
  explicit Llama(const LlamaReferenceConfig& c,
                 const std::map<std::string, torch::Tensor>& initial)
      : c_(c) {
    for (const auto& [name, value] : initial) {
      p_[name] = value.detach().clone().to(torch::kFloat32).requires_grad_(true);
    }
  }

  const torch::Tensor& P(const std::string& name) {
    auto it = p_.find(name);
    if (it == p_.end()) {
      ADD_FAILURE() << "the initial parameters have no " << name;
      static torch::Tensor none;
      return none;
    }
    return it->second;
  }
  // A bias when the configuration has one; undefined otherwise.
  torch::Tensor Bias(const std::string& name, bool present) {
    return present ? P(name) : torch::Tensor();
  }

  std::vector<torch::Tensor> Parameters() {
    std::vector<torch::Tensor> out;
    for (auto& [name, p] : p_) out.push_back(p);
    return out;
  }
  const std::map<std::string, torch::Tensor>& named() const { return p_; }

  torch::Tensor Forward(const torch::Tensor& tokens) {
    const int64_t t = tokens.size(1);
    const auto [cos, sin] = Angles(t);
    torch::Tensor x = Wire(0, torch::embedding(P("embed.weight"), tokens));
    for (int64_t l = 0; l < c_.layers; ++l) {
      const std::string n = absl::StrCat("layers.", l, ".");
      const torch::Tensor a = Attention(n, Norm(x, P(n + "input_layernorm.weight")), cos, sin);
      x = x + a;
      const torch::Tensor m = Norm(x, P(n + "post_attention_layernorm.weight"));
      const torch::Tensor gate = torch::linear(m, P(n + "mlp.gate_proj.weight"));
      const torch::Tensor up = torch::linear(m, P(n + "mlp.up_proj.weight"));
      x = Wire(l + 1, x + torch::linear(torch::silu(gate) * up,
                                        P(n + "mlp.down_proj.weight")));
    }
    x = Wire(c_.layers + 1, Norm(x, P("norm.weight")));
    return torch::linear(x, c_.tied ? P("embed.weight") : P("head.weight")).to(torch::kFloat32);
  }

 private:
  // After layer `layer` a stage may end: under bf16 the value crosses as bf16.
  torch::Tensor Wire(int layer, const torch::Tensor& x) const {
    const bool ends = std::find(c_.wire_after.begin(), c_.wire_after.end(), layer) !=
                      c_.wire_after.end();
    return c_.bf16 && ends ? x.to(torch::kBFloat16) : x;
  }

  // RMSNorm in fp32, cast back to the input's dtype, then scaled.
  torch::Tensor Norm(const torch::Tensor& x, const torch::Tensor& weight) const {
    const torch::Tensor f = x.to(torch::kFloat32);
    return weight * (f * torch::rsqrt(f.square().mean(-1, true) + c_.eps)).to(x.scalar_type());
  }

  // cos and sin [T, head_dim / 2] of position p times frequency i.
  std::pair<torch::Tensor, torch::Tensor> Angles(int64_t t) const {
    const int64_t d = c_.head_dim;
    torch::Tensor freq =
        1.0 / torch::pow(c_.theta, torch::arange(0, d, 2, torch::kInt64).to(torch::kFloat32) /
                                       static_cast<double>(d));
    if (c_.llama3.has_value()) {
      // Long wavelengths slowed by `factor`, short ones kept, those between blended.
      const LlamaReferenceConfig::Llama3& s = *c_.llama3;
      const double old = static_cast<double>(s.original_max_position_embeddings);
      const torch::Tensor wavelength = 2 * M_PI / freq;
      const torch::Tensor slow = freq / s.factor;
      const torch::Tensor blend =
          (old / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      const torch::Tensor mixed = (1 - blend) * slow + blend * freq;
      const torch::Tensor long_wave = wavelength > old / s.low_freq_factor;
      const torch::Tensor short_wave = wavelength < old / s.high_freq_factor;
      freq = torch::where(long_wave, slow, torch::where(short_wave, freq, mixed));
    }
    const torch::Tensor angle =
        torch::arange(t, torch::kFloat32).unsqueeze(1) * freq.unsqueeze(0);
    return {angle.cos(), angle.sin()};
  }

  // x [B, h, T, d]: each pair (x[i], x[i + d/2]) rotated by its angle.
  static torch::Tensor Rope(const torch::Tensor& x, const torch::Tensor& cos,
                            const torch::Tensor& sin) {
    const int64_t half = x.size(-1) / 2;
    const torch::Tensor a = x.narrow(-1, 0, half), b = x.narrow(-1, half, half);
    return torch::cat({a * cos - b * sin, b * cos + a * sin}, -1);
  }

  torch::Tensor Attention(const std::string& n, const torch::Tensor& x, const torch::Tensor& cos,
                          const torch::Tensor& sin) {
    const int64_t b = x.size(0), t = x.size(1), d = c_.head_dim;
    const int64_t groups = c_.heads / c_.kv_heads;
    auto project = [&](const char* which, int64_t heads, bool bias) {
      const std::string w = absl::StrCat(n, "self_attn.", which, "_proj.");
      return torch::linear(x, P(w + "weight"), Bias(w + "bias", bias)).view({b, t, heads, d});
    };
    torch::Tensor q = project("q", c_.heads, c_.qkv_bias);
    torch::Tensor k = project("k", c_.kv_heads, c_.qkv_bias);
    torch::Tensor v = project("v", c_.kv_heads, c_.qkv_bias);
    if (c_.qk_norm) {
      q = Norm(q, P(n + "self_attn.q_norm.weight"));
      k = Norm(k, P(n + "self_attn.k_norm.weight"));
    }
    // Each key/value head serves `groups` query heads (transformers' repeat_kv).
    auto repeat = [&](const torch::Tensor& y) {
      return y.unsqueeze(2).expand({b, c_.kv_heads, groups, t, d}).reshape({b, c_.heads, t, d});
    };
    q = Rope(q.permute({0, 2, 1, 3}), cos, sin);
    k = repeat(Rope(k.permute({0, 2, 1, 3}), cos, sin));
    v = repeat(v.permute({0, 2, 1, 3}));
    const torch::Tensor mask = torch::full({t, t}, -std::numeric_limits<float>::infinity())
                                   .triu(1);
    torch::Tensor scores = torch::matmul(q, k.transpose(-1, -2)) / std::sqrt(double(d));
    const torch::Tensor probs = torch::softmax(scores.to(torch::kFloat32) + mask, -1);
    const torch::Tensor y = torch::matmul(probs, v).transpose(1, 2).reshape({b, t, c_.heads * d});
    const std::string o = n + "self_attn.o_proj.";
    return torch::linear(y, P(o + "weight"), Bias(o + "bias", c_.o_bias));
  }

  const LlamaReferenceConfig& c_;
  std::map<std::string, torch::Tensor> p_;
};

}  // namespace

LlamaReferenceResult TrainLlamaReference(const LlamaReferenceConfig& c) {
  Llama llama(c, c.initial);
  EXPECT_EQ(c.initial.count("head.weight"), c.tied ? 0u : 1u);
  LlamaReferenceResult result;
  TrainDecoderOnSyntheticTokens(
      c, llama.Parameters(), [&](const torch::Tensor& x) { return llama.Forward(x); }, c.bf16,
      &result.losses, &result.grad_norms);
  for (const auto& [name, p] : llama.named()) result.params[name] = p.detach().clone();
  return result;
}

namespace {

// The reference for inference with `params`: fp32, and a tied model's head is its embedding.
std::pair<LlamaReferenceConfig, std::map<std::string, torch::Tensor>> ForInference(
    const LlamaReferenceConfig& config, const std::map<std::string, torch::Tensor>& params) {
  std::pair<LlamaReferenceConfig, std::map<std::string, torch::Tensor>> out{config, params};
  out.first.bf16 = false;
  if (out.first.tied) out.second.erase("head.weight");
  return out;
}

}  // namespace

torch::Tensor LlamaReferenceLogits(const LlamaReferenceConfig& config,
                                   const std::map<std::string, torch::Tensor>& params,
                                   const torch::Tensor& tokens) {
  const auto [c, initial] = ForInference(config, params);
  Llama llama(c, initial);
  torch::NoGradGuard no_grad;
  return llama.Forward(tokens);
}

std::vector<int64_t> GreedyLlamaReference(const LlamaReferenceConfig& config,
                                          const std::map<std::string, torch::Tensor>& params,
                                          const std::vector<int64_t>& prompt, int n,
                                          int64_t max_positions) {
  const auto [c, initial] = ForInference(config, params);
  Llama llama(c, initial);
  return GreedyDecode([&](const torch::Tensor& x) { return llama.Forward(x); }, prompt, n,
                      max_positions);
}

}  // namespace stagecoach::testing
