// The built-in Llama family trains across worker processes exactly as an unpipelined model
// does: for small configurations of each model_type's switches, a job's every step loss and
// every final parameter equal tests/support/reference_llama.h's plain-LibTorch Llama, trained
// from the job's own step-0 checkpoint on the same batches:
//   llama   grouped-query attention (4 heads, 2 key/value heads), llama3 rope scaling, untied:
//           1F1B over 4 workers;
//   qwen2   q/k/v biases, tied embeddings (the ends on one rank), clipping: ZBVZeroBubble, 2
//           workers x 2 stages;
//   qwen3   per-head q/k RMSNorm, head_dim 6 (not hidden / heads), tied across ranks: 1F1B on
//           2 stages x 2 replicas (the reference splits the batch into 2 x 2 microbatches);
//   mistral bf16, 1F1B on 2 workers, held to the bf16 reference (the hidden state crossing the
//           stage boundary in bf16, as the executor sends it);
//   model.hf a qwen2 checkpoint directory (config.json, BF16 weights in 3 shards and an index)
//           that tests/support/hf_llama_ref.py writes with the standard library: the job starts
//           from the stored values and trains like the reference, 1F1B on 2 workers.
// Both precisions within the numerical contract's rtol 1e-5 + atol 1e-6. For bf16 that holds
// because both sides round at the same places (autocast's bf16 matmuls, the bf16 stage
// boundary) and follow transformers' formulas op for op (rsqrt, silu, repeat_kv): an op written
// differently moves a last fp32 bit that bf16 then rounds to a bf16 ulp (2^-8), which put a
// first version of the reference 0.5% of the training's movement away. The test also checks
// the bf16 job is over 100 times further from the fp32 reference than from the bf16 one, so the
// tolerance tells bf16 from fp32.
// SGD with momentum, not AdamW: a key bias's gradient is zero in exact arithmetic (softmax
// ignores a constant added to every key) and rounding noise in practice, which AdamW would
// scale up to steps that differ between any two correct implementations.
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/util/sha256.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/local_cluster.h"
#include "tests/support/process.h"
#include "tests/support/python.h"
#include "tests/support/reference_llama.h"
#include "tests/support/stage_files.h"
#include "tests/support/step_zero.h"

namespace stagecoach::testing::llama_training_test {
namespace {

constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;
constexpr int64_t kSteps = 4;

struct Case {
  std::string name;
  std::string builtin;  // the model's keys after family: llama
  std::string schedule;
  int workers, replicas, stages, microbatches;
  bool bf16 = false;
  bool clip = false;
  LlamaReferenceConfig ref;  // the model's sizes and switches
  // model.hf: config.json's text for a checkpoint directory hf_llama_ref.py writes (BF16, 3
  // shards); the spec's model is {hf: {path, seq: 8}} instead of `builtin`.
  std::string hf_config;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

constexpr char kSizes[] =
    "vocab_size: 32, hidden_size: 24, intermediate_size: 40, num_hidden_layers: 2, "
    "num_attention_heads: 4, seq: 8, seed: 6";

LlamaReferenceConfig Sizes() {
  LlamaReferenceConfig r;
  r.vocab = 32;
  r.hidden = 24;
  r.intermediate = 40;
  r.layers = 2;
  r.heads = 4;
  r.kv_heads = 4;
  r.head_dim = 6;
  r.seq = 8;
  return r;
}

// The job's spec; with `hf_dir` its model is {hf: {path: hf_dir}}. `again`: a second job of
// one step, from `resume_from` when given.
std::string Spec(const Case& c, const std::string& ckpt, const std::string& hf_dir,
                 bool again = false, const std::string& resume_from = "") {
  const std::string model =
      hf_dir.empty()
          ? absl::StrCat("  builtin: {family: llama, ", kSizes, ", ", c.builtin, "}\n")
          : absl::StrCat("  hf: {path: ", hf_dir, ", seq: 8}\n");
  return absl::StrCat(
      "name: ", c.name, again ? "-again" : "", "\nmodel:\n", model,
      "split: {stages: ", c.stages, "}\n", "schedule: {kind: ", c.schedule,
      ", microbatches: ", c.microbatches, "}\n", "placement: {workers: ", c.workers,
      ", replicas: ", c.replicas, "}\n", "training:\n  batch_size: 8\n  steps: ",
      again ? 1 : kSteps,
      resume_from.empty() ? "" : absl::StrCat("\n  resume_from: ", resume_from),
      "\n  loss: cross_entropy\n", "  optimizer: {kind: sgd, lr: 0.2, momentum: 0.9}\n",
      c.clip ? "  grad_clip: {max_norm: 0.5}\n" : "", c.bf16 ? "  precision: bf16\n" : "",
      "  checkpoint: {dir: ", ckpt, "}\n", "data: {kind: synthetic, seed: 9}\n");
}

std::vector<Case> Cases() {
  std::vector<Case> out;
  {
    Case c{"llama-gqa-rope3", "num_key_value_heads: 2, max_position_embeddings: 64, "
           "rope_theta: 500.0, rope_scaling: {rope_type: llama3, factor: 8.0, "
           "low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position_embeddings: 16}",
           "1F1B", 4, 1, 4, 4};
    c.ref = Sizes();
    c.ref.kv_heads = 2;
    c.ref.theta = 500.0;
    c.ref.llama3 = LlamaReferenceConfig::Llama3{8.0, 1.0, 4.0, 16};
    out.push_back(c);
  }
  {
    Case c{"qwen2-tied-zbv", "model_type: qwen2, tie_word_embeddings: true", "ZBVZeroBubble",
           2, 1, 4, 4};
    c.clip = true;
    c.ref = Sizes();
    c.ref.qkv_bias = true;
    c.ref.tied = true;
    out.push_back(c);
  }
  {
    Case c{"qwen3-replicas", "model_type: qwen3, head_dim: 4, tie_word_embeddings: true",
           "1F1B", 2, 2, 2, 2};
    c.ref = Sizes();
    c.ref.head_dim = 4;
    c.ref.qk_norm = true;
    c.ref.tied = true;
    out.push_back(c);
  }
  {
    Case c{"mistral-bf16", "model_type: mistral, num_key_value_heads: 2", "1F1B", 2, 1, 2, 4};
    c.bf16 = true;
    c.ref = Sizes();
    c.ref.kv_heads = 2;
    out.push_back(c);
  }
  {
    Case c{"hf-qwen2-shards", "", "1F1B", 2, 1, 2, 4};
    c.hf_config = R"({"model_type": "qwen2", "vocab_size": 32, "hidden_size": 24,
        "intermediate_size": 40, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 64, "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-06, "tie_word_embeddings": true, "torch_dtype": "bfloat16"})";
    c.ref = Sizes();
    c.ref.kv_heads = 2;
    c.ref.qkv_bias = true;
    c.ref.tied = true;
    c.ref.theta = 1e6;
    out.push_back(c);
  }
  return out;
}

// The layers after which a stage ends (0 embed, 1 + i layers.i, then norm and head): each
// stage's last layer, from the names in its step-0 file.
std::vector<int> StageEnds(const std::string& ckpt, int stages, int64_t decoder_layers) {
  std::vector<int> ends;
  for (int s = 0; s + 1 < stages; ++s) {
    int last = -1;
    for (const auto& [name, p] : LoadStageFile(StageFilePath(ckpt, 0, s))) {
      int layer = 0;
      if (absl::StartsWith(name, "layers.")) {
        layer = 1 + std::stoi(name.substr(7));
      } else if (absl::StartsWith(name, "norm.")) {
        layer = static_cast<int>(decoder_layers) + 1;
      } else if (absl::StartsWith(name, "head.")) {
        layer = static_cast<int>(decoder_layers) + 2;
      }
      last = std::max(last, layer);
    }
    ends.push_back(last);
  }
  return ends;
}

std::string HfScript() { return TestDataDir() + "/../support/hf_llama_ref.py"; }

// transformers' name of a parameter (written here from its modeling files, not from ours).
std::string TransformersName(const std::string& name) {
  if (name == "embed.weight") return "model.embed_tokens.weight";
  if (name == "head.weight") return "lm_head.weight";
  return "model." + name;  // layers.*, norm.weight
}

class LlamaTraining : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { setenv("OMP_NUM_THREADS", "1", 1); }
};

TEST_P(LlamaTraining, EqualsTheUnpipelinedReference) {
  const Case& c = GetParam();
  ClusterOptions options;
  options.workers = c.workers * c.replicas;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& cl = **cluster;
  const std::string ckpt = cl.dir() + "/ckpt";
  std::string hf_dir;
  if (!c.hf_config.empty()) {
    hf_dir = cl.dir() + "/hf-model";
    const CommandResult wrote =
        RunCommand({kPython, HfScript(), "write", hf_dir, c.hf_config, "--dtype", "BF16",
                    "--shards", "3", "--seed", "11"},
                   absl::Seconds(60));
    ASSERT_EQ(wrote.exit_code, 0) << wrote.err;
  }
  v1::Job done;
  ASSERT_NO_FATAL_FAILURE(
      RunFromAStepZeroCheckpoint(cl, cl.WriteFile("spec.yaml", Spec(c, ckpt, hf_dir)), &done));
  ASSERT_EQ(done.losses_size(), kSteps);

  LlamaReferenceConfig ref = c.ref;
  ref.initial = LoadAllStageFiles(ckpt, 0, c.stages);
  ref.wire_after = StageEnds(ckpt, c.stages, ref.layers);
  if (!hf_dir.empty()) {
    // The job started from the stored values: BF16 widened exactly.
    const CommandResult values = RunCommand(
        {kPython, HfScript(), "values", hf_dir, "model.layers.1.self_attn.k_proj.bias"},
        absl::Seconds(60));
    ASSERT_EQ(values.exit_code, 0) << values.err;
    std::vector<float> stored;
    for (absl::string_view line : absl::StrSplit(values.out, '\n', absl::SkipEmpty())) {
      stored.push_back(std::stof(std::string(line)));
    }
    EXPECT_TRUE(torch::equal(ref.initial.at("layers.1.self_attn.k_proj.bias"),
                             torch::tensor(stored)));
  }
  ref.bf16 = c.bf16;
  ref.data_seed = 9;
  ref.batch_size = 8;
  ref.microbatches = c.microbatches * c.replicas;
  ref.steps = kSteps;
  ref.lr = 0.2;
  if (c.clip) ref.max_norm = 0.5;
  ref.momentum = 0.9;
  const LlamaReferenceResult want = TrainLlamaReference(ref);
  ASSERT_EQ(want.losses.size(), static_cast<size_t>(kSteps));

  std::cerr.precision(9);
  for (int k = 0; k < kSteps; ++k) {
    std::cerr << c.name << " step " << k << ": job " << done.losses(k) << ", reference "
              << want.losses[k] << "\n";
    EXPECT_NEAR(done.losses(k), want.losses[k], kAtol + kRtol * std::abs(want.losses[k]))
        << "step " << k;
  }
  const std::map<std::string, torch::Tensor> final_params = LoadAllStageFiles(ckpt, kSteps, c.stages);
  ASSERT_EQ(final_params.size(), want.params.size());
  double largest = 0;
  for (const auto& [name, p] : want.params) {
    ASSERT_EQ(final_params.count(name), 1u) << name;
    const torch::Tensor got = final_params.at(name);
    largest = std::max(largest, ((got - p).abs() / (p.abs() + 1e-3)).max().item<double>());
    EXPECT_TRUE(torch::allclose(got, p, kRtol, kAtol)) << name;
    EXPECT_FALSE(torch::equal(got, ref.initial.at(name))) << name << " did not train";
  }
  std::cerr << c.name << ": largest relative parameter difference " << largest << "\n";
  if (c.bf16) {
    // The tolerance still tells bf16 from fp32: the fp32 reference is further off.
    LlamaReferenceConfig fp32 = ref;
    fp32.bf16 = false;
    const LlamaReferenceResult other = TrainLlamaReference(fp32);
    // How far the job's parameters moved from the bf16 and from the fp32 reference's, as a
    // fraction of how far training moved them.
    auto distance = [&](const std::map<std::string, torch::Tensor>& params) {
      double off = 0, moved = 0;
      for (const auto& [name, p] : params) {
        off += (final_params.at(name) - p).square().sum().item<double>();
        moved += (p - ref.initial.at(name)).square().sum().item<double>();
      }
      return std::sqrt(off / moved);
    };
    const double to_bf16 = distance(want.params), to_fp32 = distance(other.params);
    std::cerr << c.name << ": parameter distance to the bf16 reference " << to_bf16
              << ", to the fp32 reference " << to_fp32 << " (of the training's own movement)\n";
    EXPECT_GT(to_fp32, 100 * to_bf16);
  }

  // The checkpoint's hf/ export, read by the independent reader: the final parameters under
  // transformers' names, F32, bit for bit; and config.json beside them.
  const std::string export_dir = absl::StrFormat("%s/step-%06d/hf", ckpt, kSteps);
  const CommandResult listed =
      RunCommand({kPython, TestDataDir() + "/../support/safetensors_ref.py", "read", export_dir},
                 absl::Seconds(60));
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  const nlohmann::json stored = nlohmann::json::parse(listed.out);
  ASSERT_EQ(stored.size(), final_params.size());
  for (const auto& [name, p] : final_params) {
    const std::string hf_name = TransformersName(name);
    ASSERT_TRUE(stored.contains(hf_name)) << hf_name;
    EXPECT_EQ(stored[hf_name]["dtype"], "F32") << hf_name;
    EXPECT_EQ(stored[hf_name]["shape"].get<std::vector<int64_t>>(), p.sizes().vec()) << hf_name;
    const torch::Tensor bytes = p.contiguous();
    EXPECT_EQ(stored[hf_name]["sha256"],
              Sha256Hex(absl::string_view(static_cast<const char*>(bytes.data_ptr()),
                                          bytes.numel() * bytes.element_size())))
        << hf_name;
  }
  EXPECT_TRUE(std::filesystem::exists(export_dir + "/config.json"));

  // A job started from the export (model.hf for a model that came from one, resume_from for a
  // built-in) holds the first job's final parameters at its step 0.
  const std::string again_ckpt = cl.dir() + "/ckpt-again";
  v1::Job again;
  ASSERT_NO_FATAL_FAILURE(RunFromAStepZeroCheckpoint(
      cl,
      cl.WriteFile("again.yaml", Spec(c, again_ckpt, hf_dir.empty() ? "" : export_dir,
                                      /*again=*/true, hf_dir.empty() ? export_dir : "")),
      &again));
  const std::map<std::string, torch::Tensor> restarted = LoadAllStageFiles(again_ckpt, 0, c.stages);
  ASSERT_EQ(restarted.size(), final_params.size());
  for (const auto& [name, p] : final_params) {
    EXPECT_TRUE(torch::equal(restarted.at(name), p)) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, LlamaTraining, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string name = info.param.name;
                           for (char& ch : name) {
                             if (ch == '-') ch = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace stagecoach::testing::llama_training_test
