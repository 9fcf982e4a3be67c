// The typed job spec: what a user's YAML file (DESIGN.md "Spec") means once parsed and validated.
// Produced by ParseJobSpec (spec_parser.h); consumed by the coordinator's planner and by workers.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "common/hf/decoder_config.h"

namespace stagecoach::spec {

// model.builtin: a model family built in to the worker.
struct BuiltinModel {
  // "mlp", "gpt" or "llama" (common/spec/builtin_model.h says what each family's layers are).
  std::string family;
  // mlp: layer widths [in, h1, ..., out]; layer i is Linear(sizes[i], sizes[i+1]) followed by
  // ReLU except after the last. At least two entries.
  std::vector<int64_t> sizes;
  // gpt: vocabulary size, model width, number of blocks, attention heads, sequence length.
  // llama: the same five, mirrored from `decoder` (vocab_size, hidden_size, num_hidden_layers,
  // num_attention_heads) and the training window `seq` (<= max_position_embeddings).
  int64_t vocab = 0;
  int64_t d_model = 0;
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t seq = 0;
  // Seed of the parameter initialisation: every worker seeds LibTorch's generator with it and
  // builds all layers in order, so each keeps exactly its layers of one identical model (the
  // same parameters torch.manual_seed(seed) and PyTorch's default init would give).
  uint64_t seed = 0;
  // gpt and llama: the token embedding and the output head are one parameter
  // (TiedEmbeddingName in builtin_model.h is head.weight). When they sit on different stages each
  // holds a copy and their gradients are summed between the two after the step's backward and
  // replica reduction, before the optimizer step, so the copies stay identical.
  bool tie_embeddings = false;
  // llama: the decoder's configuration under Hugging Face's config.json names (its
  // tie_word_embeddings is tie_embeddings above). Set exactly for family llama.
  std::optional<hf::DecoderConfig> decoder;
  // llama from model.hf: the Hugging Face directory whose safetensors hold the initial
  // parameters (each worker reads its stages' tensors); empty: drawn from `seed`.
  std::string weights_dir;
};

// model.hf: a Hugging Face checkpoint directory (config.json, model.safetensors or an index
// and its shards). hf_model_spec.h reads its config.json into `builtin` (family llama).
struct HfModelSpec {
  std::string path;
  int64_t seq = 0;  // the training window; 0: the config's max_position_embeddings
};

struct ModelSpec {
  // Exactly one of torchscript, builtin and hf is given in the spec.
  std::optional<std::string> torchscript;  // path or uploaded artifact name of a TorchScript file
  std::optional<BuiltinModel> builtin;
  // With hf, `builtin` is what its config.json describes once ResolveHfModel has read it.
  std::optional<HfModelSpec> hf;
};

struct SplitSpec {
  // Number of pipeline stages. 0 means "not given": derived from placement.workers and the
  // schedule's stages per rank.
  int stages = 0;
  // split.points: qualified submodule name -> "beginning" | "end" (PyTorch's SplitPoint).
  std::map<std::string, std::string> points;
  // "equal-layers" (default), "equal-params", "profiled", "memory" (balance the ranks'
  // predicted memory; needs the profile's sizes) or "fewer-first-last" (equal layers, but the
  // first and last stage each count as holding one layer more: torchtitan's
  // first/last_stage_less_layers).
  std::string policy = "equal-layers";
  // Whether the spec gave split.policy (a `schedule.kind: auto` search tries every policy
  // unless it is given).
  bool policy_given = false;
};

struct ScheduleSpec {
  // Generator name as the user wrote it (lookup is case-insensitive), e.g. "1F1B", or "auto"
  // (the coordinator searches schedules, stages per worker, microbatch counts and split
  // policies and takes the fastest plan that fits placement.memory_limit; see IsAutoSchedule).
  // Empty when `csv` is given.
  std::string kind;
  // Microbatches per step, >= 1.
  int microbatches = 1;
  // Whether the spec gave schedule.microbatches (an auto search tries the batch's divisors
  // unless it is given).
  bool microbatches_given = false;
  // schedule.csv: a user's schedule file (stagectl sends its contents in csv_text).
  std::string csv;
  std::string csv_text;
  // "compute_only" (default) or "compute_comms".
  std::string csv_format = "compute_only";
};

// ZeRO's levels: what the data-parallel replicas shard (PlacementSpec::shard). Ordered: each
// level shards what the one before does and more.
enum class ShardLevel { kNone = 0, kOptimizer = 1, kGradients = 2, kParameters = 3 };
// "none", "optimizer", "gradients", "parameters".
const char* ShardLevelName(ShardLevel level);

struct PlacementSpec {
  // Workers (ranks) the job needs. 0 means "not given": derived from split.stages.
  int workers = 0;
  // "cpu" (default) or "cuda".
  std::string device = "cpu";
  // "" (the schedule's own), "loop" or "v".
  std::string style;
  // Data-plane transport: "auto" (default: the backend common/transport/backends.h picks for
  // the device, nccl for cuda, gloo for cpu) or a registered backend's name.
  std::string transport = "auto";
  // Data-parallel replicas of the pipeline (>= 1): the job needs workers x replicas workers.
  // The global batch is split into replicas x schedule.microbatches microbatches; replica r
  // runs microbatches [r*M, (r+1)*M), and each stage's gradients are averaged over the replicas.
  int replicas = 1;
  // placement.shard (docs/sharding.md): what of each stage the replicas keep only 1/replicas of.
  // kOptimizer (ZeRO-1, also placement.shard_optimizer: true): the optimizer state; gradients
  // are reduce-scattered and the stepped parameters all-gathered instead of all-reduced.
  // kGradients (ZeRO-2): also the gradients, freed in full once reduce-scattered. kParameters
  // (ZeRO-3): also the parameters, gathered at each UNSHARD and freed at each RESHARD. Only with
  // replicas > 1; kNone otherwise.
  ShardLevel shard = ShardLevel::kNone;
  // placement.shard: auto (with schedule.kind: auto and replicas): the plan search chooses the
  // level, the lowest whose plan fits placement.memory_limit; `shard` is kNone until it has.
  bool shard_auto = false;
  // placement.unshard, with shard: parameters. "step": a stage's parameters stay gathered from
  // its first use in a step to the step's end (one all-gather per stage and step); "stage":
  // gathered for each run of the stage's actions, and the next stage's gather starts while the
  // current one computes (less memory, more all-gathers where a rank's stages alternate).
  std::string unshard = "step";
  bool shards() const { return shard != ShardLevel::kNone; }
  // Start a stage's gradient reduction at its REDUCE_GRAD, on a communication thread, while the
  // rank goes on with the rest of its actions (true); false reduces every stage after the step.
  bool overlap_reduction = true;
  // placement.memory_limit ("8GiB", "512MiB" or a number of bytes): the most one worker may
  // hold, parameters, gradients, optimizer state and a step's activations together, as the
  // planner predicts them; 0 means no limit. A plan predicted over it is refused.
  int64_t memory_limit_bytes = 0;
  // placement.spares: idle workers held for the job besides its ranks (docs/recovery.md). The
  // job is first placed once it has them all; no other job is placed on them, and its restarts
  // and healings take them first (a restart then holds free workers again, up to this many).
  int spares = 0;
};

struct OptimizerSpec {
  // "sgd" or "adamw".
  std::string kind = "sgd";
  double lr = 0.01;
  double weight_decay = 0.0;  // sgd default 0; adamw default 0.01
  double momentum = 0.0;      // sgd only
  double beta1 = 0.9;         // adamw only
  double beta2 = 0.999;       // adamw only
  double eps = 1e-8;          // adamw only
};

// training.lr_schedule: the learning rate at each global step k of a timeline of T steps (the
// resumed checkpoint's step + training.steps), from the optimizer's lr (base). Warmup: k < w
// gives base * (k+1) / (w+1); then constant stays at base, linear and cosine decay from base at
// k = w to exactly min_lr at k = T-1, and steps past T-1 stay at min_lr (LearningRateAt in
// common/spec/learning_rate.h).
struct LrScheduleSpec {
  // "constant", "linear" or "cosine".
  std::string kind = "constant";
  int64_t warmup_steps = 0;
  double min_lr = 0.0;  // linear and cosine only
};

struct CheckpointSpec {
  // Directory on the workers' filesystem; empty means no checkpoints.
  std::string dir;
  // Write one every this many steps; 0 means only at the end of the job.
  int64_t every_steps = 0;
  // Write the files off the step loop (task/checkpoint_steps.h): the step copies the state to
  // host memory and trains on while a background writer pickles, hashes and syncs them.
  bool async = true;
};

// training.snapshot: in-memory snapshots (docs/recovery.md). After every `every_steps`-th
// global step each rank keeps its stages' training state in its worker's memory and sends a
// copy to another rank's worker (worker/runtime/snapshot/), so that a restart after a lost
// worker continues from the latest snapshot instead of the latest checkpoint on disk.
struct SnapshotSpec {
  // 0: no snapshots.
  int64_t every_steps = 0;
};

struct TrainingSpec {
  // Rows per step, split into schedule.microbatches microbatches along dimension 0.
  int64_t batch_size = 0;
  // Training steps to run, >= 1.
  int64_t steps = 1;
  // "mse" (mean over the microbatch's elements) or "cross_entropy" (mean over its rows).
  std::string loss = "mse";
  OptimizerSpec optimizer;
  CheckpointSpec checkpoint;
  SnapshotSpec snapshot;
  // training.resume_from: a checkpoint step directory (<checkpoint dir>/step-<NNNNNN>; a path to
  // its manifest.json is read as the directory; on the
  // workers' filesystem, which the coordinator also sees) to start from instead of the model's
  // initial parameters; empty means none. The job runs `steps` more steps after the
  // checkpoint's, and its data stream continues at the checkpoint's step.
  std::string resume_from;
  // Divide the accumulated gradients by the number of microbatches (PyTorch's scale_grads).
  bool scale_grads = true;
  // training.loss_normalization: "tokens" (the step's loss is the sum of every counted token's
  // cross-entropy over the whole global batch / their count), "microbatches" (the mean of the
  // microbatch means), or empty: tokens for tokens data with cross_entropy, else microbatches
  // (LossNormalizationOf in builtin_model.h resolves it).
  std::string loss_normalization;
  LrScheduleSpec lr_schedule;
  // training.grad_clip.max_norm: clip the gradients of the whole model (every stage, after the
  // replica reduction) to this global L2 norm, as torch.nn.utils.clip_grad_norm_; unset: no
  // clipping.
  std::optional<double> grad_clip_max_norm;
  // The job fails after this many consecutive steps skipped for non-finite gradients.
  int64_t max_skipped_steps = 10;
  // "none" or "full": with full, a stage keeps only its inputs after F and recomputes its
  // forward in B (or I) to run the backward.
  std::string activation_checkpointing = "none";
  // "fp32" or "bf16": mixed precision with a fixed op policy (worker/model/precision.h):
  // matmuls in bf16, LayerNorm, softmax and the loss in fp32, fp32 master weights and optimizer
  // state, stage outputs (and so their gradients) in bf16 on the wire.
  std::string precision = "fp32";
};

struct DataSpec {
  // "synthetic" (default; for a built-in mlp or gpt), "tokens", "jsonl" (fine-tuning records,
  // worker/runtime/data/jsonl_records.h) or "tensors".
  std::string kind = "synthetic";
  // Path on the workers' filesystem (tokens, tensors).
  std::string path;
  // Seed of the data stream (and, for built-in models, of the parameter initialisation).
  uint64_t seed = 0;
  // tokens: window length (tokens per row) for a TorchScript model; a built-in gpt uses
  // model.builtin.seq. 0 when not given.
  int64_t seq = 0;
  // tokens: the ids' width in the file, "uint16" (default) or "uint32" (vocabularies over
  // 65,536; stagectl tokens --dtype).
  std::string dtype = "uint16";
  // tokens: rows of whole documents (each ending with the EOS id `eos`) instead of random
  // windows: "pad" (a row is one document, each microbatch padded to its longest row) or "pack"
  // (a row is as many whole documents as fit, attending within each); empty: "pack" when `eos`
  // is given, else the windows (worker/runtime/data/document_rows.h).
  std::string packing;
  // tokens: the id that ends every document (the tokenizer's EOS); with packing, defaults to the
  // model's eos_token_id.
  std::optional<int64_t> eos;
  // jsonl: the SentencePiece model that tokenizes the records (a path on the workers'
  // filesystem), the records' prompt and response keys, and what a record longer than the
  // window becomes: "truncate" (cut to it), "skip" (left out) or "fail" (the job fails naming
  // its line).
  std::string tokenizer;
  std::string prompt_field = "prompt";
  std::string response_field = "response";
  std::string overlong = "truncate";
};

// restart: what happens when a job fails (a lost worker, a transport error).
struct RestartSpec {
  // Times the job may be restarted from its latest checkpoint before it goes to FAILED; 0 (the
  // default) means never.
  int max_restarts = 0;
  // With placement.replicas > 1: a lost worker's replica leaves the job and the healthy
  // replicas run its microbatches from the step in flight on (docs/recovery.md), instead of a
  // restart. Unset: on where it can be (not with placement.shard_optimizer, whose lost shard of
  // the optimizer state exists nowhere else); true with shard_optimizer is refused.
  std::optional<bool> carry_on;
  // Elastic shrink and grow (docs/recovery.md): when a restart finds too few free workers for
  // `wait`, the coordinator re-plans the job on those it has (fewer pipeline ranks, the layers
  // split over fewer stages, or fewer replicas; never fewer than `min_workers`) and resumes it
  // from its latest checkpoint by parameter name; with `grow`, it goes back to its own plan at
  // the first checkpoint after enough workers are free again. Each shrink is a restart
  // (max_restarts); growing back is not.
  bool elastic = false;
  int min_workers = 1;
  absl::Duration wait = absl::Seconds(60);
  bool grow = true;
};

// eval: a validation pass, forward only through the job's own pipeline, over `batches` held-out
// batches of training.batch_size rows (batch j = the eval data stream's step j) after every
// `every_steps`-th global step.
struct EvalSpec {
  int64_t every_steps = 0;
  int64_t batches = 1;
  // The held-out data: the same kinds as the training data (synthetic from its seed, tokens or
  // tensors from a path).
  DataSpec data;
};

struct JobSpec {
  // Job name: [a-z0-9]([a-z0-9-]*[a-z0-9])?, at most 63 characters (a DNS label).
  std::string name;
  ModelSpec model;
  SplitSpec split;
  ScheduleSpec schedule;
  PlacementSpec placement;
  TrainingSpec training;
  DataSpec data;
  RestartSpec restart;
  // Unset: no validation.
  std::optional<EvalSpec> eval;
};

// Whether a job of `spec` carries on without a lost replica: placement.replicas > 1 and
// restart.carry_on, unset meaning "unless placement.shard_optimizer" (RestartSpec::carry_on).
bool CarriesOn(const JobSpec& spec);

// Whether the job's stages keep their parameters sharded across replicas: placement.shard:
// parameters with placement.replicas > 1.
bool ShardsParameters(const JobSpec& spec);

// Whether `data` is token data a decoder trains on from a file: a token file or fine-tuning
// records (their rows hold token ids, and their targets are counted).
inline bool IsTokenData(const DataSpec& data) {
  return data.kind == "tokens" || data.kind == "jsonl";
}

// The job's training.loss_normalization, resolved: as given, else "tokens" for token data
// (IsTokenData) with the cross_entropy loss, else "microbatches".
inline std::string LossNormalizationOf(const JobSpec& spec) {
  if (!spec.training.loss_normalization.empty()) return spec.training.loss_normalization;
  return IsTokenData(spec.data) && spec.training.loss == "cross_entropy" ? "tokens"
                                                                         : "microbatches";
}

// Whether schedule.kind asks the coordinator to choose the plan ("auto", in any case).
inline bool IsAutoSchedule(const ScheduleSpec& schedule) {
  return absl::EqualsIgnoreCase(schedule.kind, "auto");
}

}  // namespace stagecoach::spec
