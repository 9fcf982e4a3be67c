#include "worker/model/gpt.h"

#include <torch/nn/init.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/utils.h>

#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/model/layer_chain.h"
#include "worker/model/precision.h"

namespace stagecoach::model {
// Named after the file: the GPT and the Llama family both have an Embed, an Attention and a
// Norm, and a unity build may put both files in one translation unit.
namespace gpt_layers {
namespace {

constexpr double kInitStd = 0.02;

void InitLinear(torch::nn::Linear& linear) {
  torch::NoGradGuard no_grad;
  linear->weight.normal_(0.0, kInitStd);
  if (linear->bias.defined()) linear->bias.zero_();
}

void InitLayerNorm(torch::nn::LayerNorm& norm) {
  torch::NoGradGuard no_grad;
  norm->weight.fill_(1.0);
  norm->bias.zero_();
}

class Embed : public ChainLayer {
 public:
  Embed(int64_t vocab, int64_t seq, int64_t d)
      : seq_(seq),
        tok_(register_module("tok", torch::nn::Embedding(torch::nn::EmbeddingOptions(vocab, d)))),
        pos_(register_module("pos", torch::nn::Embedding(torch::nn::EmbeddingOptions(seq, d)))) {
    torch::NoGradGuard no_grad;
    tok_->weight.normal_(0.0, kInitStd);
    pos_->weight.normal_(0.0, kInitStd);
  }

  torch::Tensor forward(const torch::Tensor& x) override {
    TORCH_CHECK(x.dim() == 2, "gpt embed: expected token ids [batch, time], got ", x.sizes());
    TORCH_CHECK(x.scalar_type() == torch::kInt64, "gpt embed: expected int64 token ids, got ",
                x.scalar_type());
    const int64_t t = x.size(1);
    TORCH_CHECK(t >= 1 && t <= seq_, "gpt embed: sequence length ", t,
                " is outside [1, model.builtin.seq = ", seq_, "]");
    return tok_->forward(x) + pos_->weight.slice(0, 0, t);
  }

  torch::Tensor ForwardCached(const torch::Tensor& x, const DecodePositions& at,
                              LayerKv* kv) override {
    (void)kv;
    TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kInt64,
                "gpt embed: expected int64 token ids [rows, time], got ", x.sizes());
    TORCH_CHECK(at.positions.max().item<int64_t>() < seq_, "gpt embed: positions up to ",
                at.positions.max().item<int64_t>(), " are beyond model.builtin.seq = ", seq_);
    return tok_->forward(x) + torch::embedding(pos_->weight, at.positions);
  }

  // The token embedding's weight [vocab, d], which a tied head shares or copies.
  const torch::Tensor& tok_weight() const { return tok_->weight; }

 private:
  int64_t seq_;
  torch::nn::Embedding tok_;
  torch::nn::Embedding pos_;
};

class Attention : public torch::nn::Module {
 public:
  Attention(int64_t d, int64_t heads)
      : heads_(heads),
        qkv_(register_module("qkv", torch::nn::Linear(torch::nn::LinearOptions(d, 3 * d)))),
        proj_(register_module("proj", torch::nn::Linear(torch::nn::LinearOptions(d, d)))) {
    InitLinear(qkv_);
    InitLinear(proj_);
  }

  // Causal self-attention over x's positions; with `at` and `kv`, over the row's cached
  // positions too (their keys and values), x's new ones added to the cache; with `at` alone
  // (packed rows), over x's positions under at.hidden (each document apart).
  torch::Tensor forward(const torch::Tensor& x, const DecodePositions* at = nullptr,
                        LayerKv* kv = nullptr) {
    const int64_t b = x.size(0), t = x.size(1), d = x.size(2);
    const int64_t hd = d / heads_;
    std::vector<torch::Tensor> qkv = qkv_->forward(x).chunk(3, -1);
    auto split_heads = [&](const torch::Tensor& y) {
      return y.reshape({b, t, heads_, hd}).transpose(1, 2);  // [B, H, T, hd]
    };
    torch::Tensor q = split_heads(qkv[0]);
    torch::Tensor k = split_heads(qkv[1]);
    torch::Tensor v = split_heads(qkv[2]);
    torch::Tensor hidden;
    if (kv != nullptr) std::tie(k, v) = kv->Append(k, v, *at);
    if (at != nullptr) {
      hidden = at->hidden;  // a session's cached positions, or packed rows' documents
    } else {
      hidden = torch::ones({t, t}, torch::TensorOptions(torch::kBool).device(x.device())).triu(1);
    }
    torch::Tensor att = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
    att = att.masked_fill(hidden, -std::numeric_limits<float>::infinity());
    att = torch::softmax(ToFloat32(att), -1);
    torch::Tensor y = torch::matmul(att, v).transpose(1, 2).reshape({b, t, d});
    return proj_->forward(y);
  }

 private:
  int64_t heads_;
  torch::nn::Linear qkv_;
  torch::nn::Linear proj_;
};

class Mlp : public torch::nn::Module {
 public:
  explicit Mlp(int64_t d)
      : fc_(register_module("fc", torch::nn::Linear(torch::nn::LinearOptions(d, 4 * d)))),
        proj_(register_module("proj", torch::nn::Linear(torch::nn::LinearOptions(4 * d, d)))) {
    InitLinear(fc_);
    InitLinear(proj_);
  }

  torch::Tensor forward(const torch::Tensor& x) {
    return proj_->forward(torch::gelu(fc_->forward(x)));
  }

 private:
  torch::nn::Linear fc_;
  torch::nn::Linear proj_;
};

class Block : public ChainLayer {
 public:
  Block(int64_t d, int64_t heads)
      : ln1_(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        attn_(register_module("attn", std::make_shared<Attention>(d, heads))),
        ln2_(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        mlp_(register_module("mlp", std::make_shared<Mlp>(d))) {
    InitLayerNorm(ln1_);
    InitLayerNorm(ln2_);
  }

  torch::Tensor forward(const torch::Tensor& x) override {
    torch::Tensor y = x + attn_->forward(ln1_->forward(ToFloat32(x)));
    return y + mlp_->forward(ln2_->forward(ToFloat32(y)));
  }

  torch::Tensor ForwardCached(const torch::Tensor& x, const DecodePositions& at,
                              LayerKv* kv) override {
    torch::Tensor y = x + attn_->forward(ln1_->forward(ToFloat32(x)), &at, kv);
    return y + mlp_->forward(ln2_->forward(ToFloat32(y)));
  }

 private:
  torch::nn::LayerNorm ln1_;
  std::shared_ptr<Attention> attn_;
  torch::nn::LayerNorm ln2_;
  std::shared_ptr<Mlp> mlp_;
};

class Norm : public ChainLayer {
 public:
  explicit Norm(int64_t d)
      : d_(d),
        weight_(register_parameter("weight", torch::ones({d}))),
        bias_(register_parameter("bias", torch::zeros({d}))) {}

  torch::Tensor forward(const torch::Tensor& x) override {
    return torch::layer_norm(ToFloat32(x), {d_}, weight_, bias_, 1e-5);
  }

 private:
  int64_t d_;
  torch::Tensor weight_;
  torch::Tensor bias_;
};

}  // namespace
}  // namespace gpt_layers

absl::StatusOr<std::unique_ptr<StageModel>> BuildGptStage(const spec::BuiltinModel& model,
                                                          int first_layer, int end_layer) {
  if (model.family != "gpt") {
    return absl::InvalidArgumentError("model.builtin.family: not a gpt model");
  }
  for (const auto& [key, value] : {std::pair<const char*, int64_t>{"vocab", model.vocab},
                                   {"d_model", model.d_model},
                                   {"layers", model.layers},
                                   {"heads", model.heads},
                                   {"seq", model.seq}}) {
    if (value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.builtin.", key, ": must be > 0, got ", value));
    }
  }
  if (model.d_model % model.heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.builtin.d_model: must be divisible by model.builtin.heads (",
                     model.heads, "), got ", model.d_model));
  }
  const int64_t layers = model.layers + 3;
  if (first_layer < 0 || end_layer > layers || first_layer >= end_layer) {
    return absl::InvalidArgumentError(absl::StrCat("stage layers [", first_layer, ", ", end_layer,
                                                   ") are outside the GPT's ", layers, " layers"));
  }
  std::vector<std::pair<std::string, std::shared_ptr<ChainLayer>>> kept;
  {
    std::lock_guard<std::mutex> lock(SeedMutex());
    torch::manual_seed(model.seed);
    std::shared_ptr<gpt_layers::Embed> embed;
    for (int64_t i = 0; i < end_layer; ++i) {
      std::string name;
      std::shared_ptr<ChainLayer> layer;
      if (i == 0) {
        name = "embed";
        embed = std::make_shared<gpt_layers::Embed>(model.vocab, model.seq, model.d_model);
        layer = embed;
      } else if (i <= model.layers) {
        name = absl::StrCat("blocks.", i - 1);
        layer = std::make_shared<gpt_layers::Block>(model.d_model, model.heads);
      } else if (i == model.layers + 1) {
        name = "norm";
        layer = std::make_shared<gpt_layers::Norm>(model.d_model);
      } else {
        name = "head";
        if (!model.tie_embeddings) {
          layer = std::make_shared<OutputHead>(model.d_model, model.vocab, gpt_layers::kInitStd);
        } else if (first_layer == 0) {
          layer = OutputHead::Sharing(embed->tok_weight());
        } else {
          layer = OutputHead::Copying(embed->tok_weight());
        }
      }
      if (i >= first_layer) kept.emplace_back(std::move(name), std::move(layer));
    }
  }
  return std::unique_ptr<StageModel>(new LayerChainStage(std::move(kept)));
}

}  // namespace stagecoach::model
