#include "common/spec/spec_parser.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "common/checkpoint/layout.h"
#include "common/spec/builtin_fields.h"
#include "common/spec/recipe_fields.h"
#include "common/spec/shard_fields.h"
#include "common/spec/yaml_documents.h"
#include "common/spec/yaml_fields.h"
#include "common/transport/backends.h"
#include "common/util/byte_size.h"
#include "common/util/status_macros.h"

namespace stagecoach::spec {
namespace {

using yaml_fields::Describe;
using yaml_fields::Fields;
using yaml_fields::Join;
using yaml_fields::PeekScalar;
using yaml_fields::Quote;
using yaml_fields::Read;
using yaml_fields::Suggestion;
using yaml_fields::Validator;

constexpr int64_t kIntMax = std::numeric_limits<int>::max();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kMaxReplicas = 1024;
// placement.spares: more would hold a pool for one job.
constexpr int64_t kMaxSpares = 1024;
constexpr size_t kMaxNameLength = 63;

const std::vector<std::string>& TopLevelKeys() {
  static const auto* keys = new std::vector<std::string>{
      "name", "model", "split", "schedule", "placement", "training", "data", "restart", "eval"};
  return *keys;
}

// placement.shard as written: a level's name, or "auto".
std::string ShardName(const PlacementSpec& placement) {
  return placement.shard_auto ? "auto" : ShardLevelName(placement.shard);
}

// "[lo, hi)" and the like, for range errors.
std::string FormatRange(double lo, bool lo_inclusive, double hi, bool hi_inclusive) {
  return absl::StrCat(lo_inclusive ? "[" : "(", lo, ", ", hi, hi_inclusive ? "]" : ")");
}

class SpecParser {
 public:
  JobSpec Parse(const YAML::Node& root) {
    auto top = v_.Open(root, "", TopLevelKeys());
    if (!top) return spec_;
    ParseName(*top);
    ParseModel(top->Get("model"));
    ParseSplit(top->Get("split"));
    ParseSchedule(top->Get("schedule"));
    ParsePlacement(top->Get("placement"));
    ParseTraining(top->Get("training"));
    recipe_fields::ParseData(v_, top->Get("data"), "data", &spec_.data);
    ParseRestart(top->Get("restart"));
    recipe_fields::ParseEval(v_, top->Get("eval"), &spec_.eval);
    if (spec_.placement.shard_auto && !spec::IsAutoSchedule(spec_.schedule)) {
      v_.Error("placement.shard",
               "auto needs schedule.kind: auto (the plan search chooses the level); name a level "
               "(none, optimizer, gradients, parameters) for a named schedule");
    }
    if (builtin_ok_ && spec_.model.builtin->tie_embeddings &&
        (spec_.placement.shards() || spec_.placement.shard_auto)) {
      v_.Error("model.builtin.tie_embeddings",
               absl::StrCat(
                   "not supported with placement.shard: ", ShardLevelName(spec_.placement.shard),
                   " (the tied copies' gradients would be sharded differently on their "
                   "two stages)"));
    }
    const int64_t replicas = spec_.placement.replicas;
    if (microbatches_ok_ && batch_size_ok_ && replicas == 1 &&
        spec_.schedule.microbatches > spec_.training.batch_size) {
      v_.Error("schedule.microbatches",
               absl::StrCat("must be <= training.batch_size (", spec_.training.batch_size,
                            "), got ", spec_.schedule.microbatches));
    } else if (microbatches_ok_ && batch_size_ok_ &&
               spec_.schedule.microbatches * replicas > spec_.training.batch_size) {
      v_.Error(
          "training.batch_size",
          absl::StrCat("must be >= schedule.microbatches x placement.replicas (",
                       spec_.schedule.microbatches, " x ", replicas, " = ",
                       spec_.schedule.microbatches * replicas,
                       ": every replica runs that many microbatches of at least one row), got ",
                       spec_.training.batch_size));
    }
    return spec_;
  }

  const std::vector<std::string>& errors() const { return v_.errors(); }

 private:
  void ParseName(const Fields& top) {
    switch (top.String("name", &spec_.name)) {
      case Read::kAbsent:
        v_.Error("name", "required");
        return;
      case Read::kInvalid:
        return;
      case Read::kOk:
        break;
    }
    const std::string& name = spec_.name;
    if (name.size() > kMaxNameLength) {
      v_.Error("name",
               absl::StrCat("must be at most ", kMaxNameLength, " characters, got ", name.size()));
      return;
    }
    auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
    bool ok = !name.empty() && alnum(name.front()) && alnum(name.back()) &&
              std::all_of(name.begin(), name.end(), [&](char c) { return alnum(c) || c == '-'; });
    if (!ok) {
      v_.Error("name", absl::StrCat("must match [a-z0-9]([a-z0-9-]*[a-z0-9])? (lowercase letters, "
                                    "digits and '-'), got ",
                                    Quote(name)));
    }
  }

  void ParseModel(const YAML::Node& node) {
    auto model = v_.Open(node, "model", {"torchscript", "builtin", "hf"});
    if (!model) return;
    const bool has_torchscript = model->Has("torchscript");
    const bool has_builtin = model->Has("builtin");
    const bool has_hf = model->Has("hf");
    if (int{has_torchscript} + int{has_builtin} + int{has_hf} != 1) {
      v_.Error("model", "exactly one of 'torchscript', 'builtin' or 'hf' is required");
    }
    std::string torchscript;
    if (model->String("torchscript", &torchscript) == Read::kOk) {
      if (torchscript.empty()) {
        v_.Error("model.torchscript", "must be a non-empty path");
      } else {
        spec_.model.torchscript = torchscript;
      }
    }
    if (has_builtin) {
      const size_t errors_before = v_.error_count();
      BuiltinModel builtin;
      builtin_fields::ParseBuiltin(v_, model->Get("builtin"), &builtin);
      spec_.model.builtin = builtin;
      builtin_ok_ = !has_torchscript && !has_hf && v_.error_count() == errors_before;
    }
    if (has_hf) ParseHfModel(model->Get("hf"));
  }

  // model.hf: {path: DIR (required), seq: int >= 1}.
  void ParseHfModel(const YAML::Node& node) {
    auto hf = v_.Open(node, "model.hf", {"path", "seq"});
    if (!hf) return;
    HfModelSpec out;
    const Read path = hf->String("path", &out.path);
    if (path == Read::kAbsent || (path == Read::kOk && out.path.empty())) {
      v_.Error(hf->Path("path"), "required: a Hugging Face checkpoint directory");
    }
    hf->Int("seq", 1, kIntMax, &out.seq);
    spec_.model.hf = out;
  }

  void ParseSplit(const YAML::Node& node) {
    auto split = v_.Open(node, "split", {"stages", "points", "policy"});
    if (!split) return;
    const BuiltinModel* builtin = builtin_ok_ ? &*spec_.model.builtin : nullptr;
    const int64_t layer_count = builtin ? BuiltinLayerCount(*builtin) : 0;

    if (split->Int("stages", 1, kIntMax, &spec_.split.stages) == Read::kOk && builtin &&
        spec_.split.stages > layer_count) {
      v_.Error(split->Path("stages"),
               absl::StrCat("must be <= ", layer_count, " (the model's layers), got ",
                            spec_.split.stages));
    }
    if (split->Has("stages") && split->Has("points")) {
      v_.Error("split", "'stages' and 'points' are mutually exclusive");
    }
    if (split->Has("points")) {
      const std::string path = split->Path("points");
      if (auto points = v_.Entries(split->Get("points"), path)) {
        if (split->Get("points").size() == 0) v_.Error(path, "must name at least one layer");
        for (const auto& [name, value] : *points) {
          const std::string point_path = Join(path, name);
          if (!value.IsScalar() || (value.Scalar() != "beginning" && value.Scalar() != "end")) {
            v_.Error(point_path,
                     absl::StrCat("must be 'beginning' or 'end', got ", Describe(value)));
            continue;
          }
          if (builtin && !IsBuiltinLayerName(*builtin, name)) {
            constexpr int64_t kMaxSuggestionCandidates = 1000;
            const std::string suggestion = layer_count <= kMaxSuggestionCandidates
                                               ? Suggestion(name, BuiltinLayerNames(*builtin))
                                               : "";
            v_.Error(point_path,
                     absl::StrCat("not a layer of the builtin model (its layers: ",
                                  DescribeBuiltinLayerNames(*builtin), ")", suggestion));
            continue;
          }
          spec_.split.points[name] = value.Scalar();
        }
      }
    }
    spec_.split.policy_given =
        split->Enum("policy",
                    {"equal-layers", "equal-params", "profiled", "memory", "fewer-first-last"},
                    &spec_.split.policy) == Read::kOk;
  }

  void ParseSchedule(const YAML::Node& node) {
    auto schedule =
        v_.Open(node, "schedule", {"kind", "microbatches", "csv", "csv_format", "csv_text"});
    if (!schedule) return;
    ScheduleSpec& out = spec_.schedule;
    const bool has_kind = schedule->Has("kind");
    const bool has_csv = schedule->Has("csv");
    if (has_kind == has_csv) {
      v_.Error("schedule", "exactly one of 'kind' or 'csv' is required");
    }
    if (schedule->String("kind", &out.kind) == Read::kOk && out.kind.empty()) {
      v_.Error(schedule->Path("kind"), "must be a non-empty generator name");
    }
    if (schedule->String("csv", &out.csv) == Read::kOk && out.csv.empty()) {
      v_.Error(schedule->Path("csv"), "must be a non-empty path");
    }
    const Read microbatches = schedule->Int("microbatches", 1, kIntMax, &out.microbatches);
    microbatches_ok_ = microbatches != Read::kInvalid;
    out.microbatches_given = microbatches == Read::kOk;
    if (schedule->Enum("csv_format", {"compute_only", "compute_comms"}, &out.csv_format) !=
            Read::kAbsent &&
        !has_csv) {
      v_.Error(schedule->Path("csv_format"), "only valid with schedule.csv");
    }
    if (schedule->String("csv_text", &out.csv_text) != Read::kAbsent && !has_csv) {
      v_.Error(schedule->Path("csv_text"), "only valid with schedule.csv");
    }
  }

  void ParsePlacement(const YAML::Node& node) {
    auto placement =
        v_.Open(node, "placement",
                {"workers", "device", "style", "transport", "replicas", "shard", "shard_optimizer",
                 "unshard", "overlap_reduction", "memory_limit", "spares"});
    if (!placement) return;
    std::string memory_limit;
    if (placement->String("memory_limit", &memory_limit) == Read::kOk) {
      absl::StatusOr<int64_t> bytes = util::ParseBytes(memory_limit);
      if (!bytes.ok()) {
        v_.Error(placement->Path("memory_limit"), bytes.status().message());
      } else if (*bytes <= 0) {
        v_.Error(placement->Path("memory_limit"), "must be more than 0 bytes");
      } else {
        spec_.placement.memory_limit_bytes = *bytes;
      }
    }
    placement->Int("workers", 1, kIntMax, &spec_.placement.workers);
    placement->Int("replicas", 1, kMaxReplicas, &spec_.placement.replicas);
    placement->Int("spares", 0, kMaxSpares, &spec_.placement.spares);
    shard_fields::ParseShard(v_, *placement, &spec_.placement);
    placement->Bool("overlap_reduction", &spec_.placement.overlap_reduction);
    const Read device = placement->Enum("device", {"cpu", "cuda"}, &spec_.placement.device);
    placement->Enum("style", {"loop", "v"}, &spec_.placement.style);
    // "auto" or a registered backend; one that needs CUDA only with device cuda.
    const transport::BackendRegistry& backends = transport::BackendRegistry::Global();
    std::vector<std::string> transports = {"auto"};
    for (std::string& name : backends.Names()) transports.push_back(std::move(name));
    if (placement->Enum("transport", transports, &spec_.placement.transport) == Read::kOk &&
        device != Read::kInvalid) {
      const absl::Status usable =
          backends.CheckDevice(spec_.placement.transport, spec_.placement.device);
      if (!usable.ok()) v_.Error(placement->Path("transport"), usable.message());
    }
  }

  void ParseTraining(const YAML::Node& node) {
    auto training =
        v_.Open(node, "training",
                {"batch_size", "steps", "loss", "loss_normalization", "scale_grads", "optimizer",
                 "checkpoint", "snapshot", "resume_from", "lr_schedule", "grad_clip",
                 "max_skipped_steps", "activation_checkpointing", "precision"});
    if (!training) return;
    TrainingSpec& out = spec_.training;
    switch (training->Int("batch_size", 1, kInt64Max, &out.batch_size)) {
      case Read::kAbsent:
        v_.Error(training->Path("batch_size"), "required");
        break;
      case Read::kOk:
        batch_size_ok_ = true;
        break;
      case Read::kInvalid:
        break;
    }
    training->Int("steps", 1, kInt64Max, &out.steps);
    training->Enum("loss", {"mse", "cross_entropy"}, &out.loss);
    training->Bool("scale_grads", &out.scale_grads);
    if (training->Enum("loss_normalization", {"tokens", "microbatches"}, &out.loss_normalization) ==
            Read::kOk &&
        out.loss_normalization == "tokens" && out.loss != "cross_entropy") {
      v_.Error(training->Path("loss_normalization"),
               absl::StrCat("tokens needs training.loss cross_entropy (a loss per token), got ",
                            out.loss));
    }
    const size_t errors_before_optimizer = v_.error_count();
    ParseOptimizer(training->Get("optimizer"));
    recipe_fields::ParseLrSchedule(v_, training->Get("lr_schedule"), out.optimizer.lr,
                                   v_.error_count() == errors_before_optimizer, &out.lr_schedule);
    recipe_fields::ParseGradClip(v_, training->Get("grad_clip"), &out.grad_clip_max_norm);
    training->Int("max_skipped_steps", 1, kInt64Max, &out.max_skipped_steps);
    training->Enum("activation_checkpointing", {"none", "full"}, &out.activation_checkpointing);
    training->Enum("precision", {"fp32", "bf16"}, &out.precision);
    ParseCheckpoint(training->Get("checkpoint"));
    ParseSnapshot(training->Get("snapshot"));
    // The coordinator verifies the checkpoint itself (manifest, checksums, stage layout).
    if (training->String("resume_from", &out.resume_from) == Read::kOk && out.resume_from.empty()) {
      v_.Error(training->Path("resume_from"), "must be a non-empty path");
    }
    // A checkpoint's manifest names its directory.
    const std::string manifest = absl::StrCat("/", checkpoint::kManifestFileName);
    if (absl::EndsWith(out.resume_from, manifest)) {
      out.resume_from.resize(out.resume_from.size() - manifest.size());
    }
  }

  void ParseOptimizer(const YAML::Node& node) {
    const std::string path = "training.optimizer";
    const std::string kind = PeekScalar(node, "kind");
    std::optional<Fields> optimizer;
    if (kind == "adamw") {
      optimizer = v_.Open(node, path, {"kind", "lr", "weight_decay", "betas", "eps"},
                          {{"momentum", "not a key of optimizer adamw"}});
    } else if (kind == "sgd" || kind.empty()) {
      optimizer =
          v_.Open(node, path, {"kind", "lr", "weight_decay", "momentum"},
                  {{"betas", "not a key of optimizer sgd"}, {"eps", "not a key of optimizer sgd"}});
    } else {
      optimizer = v_.Open(node, path, {"kind", "lr", "weight_decay", "momentum", "betas", "eps"});
    }
    if (!optimizer) return;
    OptimizerSpec& out = spec_.training.optimizer;
    optimizer->Enum("kind", {"sgd", "adamw"}, &out.kind);
    if (out.kind == "adamw") {
      out.lr = 0.001;
      out.weight_decay = 0.01;
    }
    auto check = [&](const char* key, double* value, double lo, bool lo_inclusive, double hi,
                     bool hi_inclusive) {
      if (optimizer->Number(key, value) != Read::kOk) return;
      const bool above = lo_inclusive ? *value >= lo : *value > lo;
      const bool below = hi_inclusive ? *value <= hi : *value < hi;
      if (above && below) return;
      const std::string got = optimizer->Get(key).Scalar();
      if (std::isinf(hi)) {
        v_.Error(optimizer->Path(key),
                 absl::StrCat("must be ", lo_inclusive ? ">= " : "> ", lo, ", got ", got));
      } else {
        v_.Error(optimizer->Path(key),
                 absl::StrCat("must be in ", FormatRange(lo, lo_inclusive, hi, hi_inclusive),
                              ", got ", got));
      }
    };
    constexpr double kInf = std::numeric_limits<double>::infinity();
    check("lr", &out.lr, 0, false, kInf, false);
    check("weight_decay", &out.weight_decay, 0, true, kInf, false);
    check("momentum", &out.momentum, 0, true, 1, false);
    check("eps", &out.eps, 0, false, kInf, false);
    if (optimizer->Has("betas")) {
      const std::string betas_path = optimizer->Path("betas");
      const YAML::Node betas = optimizer->Get("betas");
      if (!betas.IsSequence()) {
        v_.Error(betas_path, absl::StrCat("must be a list of two numbers, got ", Describe(betas)));
      } else if (betas.size() != 2) {
        v_.Error(betas_path, absl::StrCat("must be a list of two numbers, got ", betas.size(),
                                          betas.size() == 1 ? " item" : " items"));
      } else {
        double* outs[2] = {&out.beta1, &out.beta2};
        for (size_t i = 0; i < 2; ++i) {
          const std::string element_path = absl::StrCat(betas_path, "[", i, "]");
          auto beta = v_.Number(betas[i], element_path);
          if (!beta) continue;
          if (*beta < 0 || *beta >= 1) {
            v_.Error(element_path, absl::StrCat("must be in [0, 1), got ", betas[i].Scalar()));
            continue;
          }
          *outs[i] = *beta;
        }
      }
    }
  }

  void ParseCheckpoint(const YAML::Node& node) {
    auto checkpoint = v_.Open(node, "training.checkpoint", {"dir", "every_steps", "async"});
    if (!checkpoint) return;
    CheckpointSpec& out = spec_.training.checkpoint;
    checkpoint->String("dir", &out.dir);
    checkpoint->Bool("async", &out.async);
    if (checkpoint->Int("every_steps", 0, kInt64Max, &out.every_steps) == Read::kOk &&
        !checkpoint->Has("dir")) {
      v_.Error(checkpoint->Path("every_steps"), "only valid with training.checkpoint.dir");
    }
  }

  // After ParsePlacement: snapshots are for jobs without replicas (replicas carry on and heal
  // from each other instead).
  void ParseSnapshot(const YAML::Node& node) {
    auto snapshot = v_.Open(node, "training.snapshot", {"every_steps"});
    if (!snapshot) return;
    if (snapshot->Int("every_steps", 0, kInt64Max, &spec_.training.snapshot.every_steps) ==
            Read::kOk &&
        spec_.training.snapshot.every_steps > 0 && spec_.placement.replicas > 1) {
      v_.Error(snapshot->Path("every_steps"),
               "not supported with placement.replicas > 1: replicas carry on and heal from a "
               "live replica instead (restart.carry_on)");
    }
  }

  void ParseRestart(const YAML::Node& node) {
    auto restart =
        v_.Open(node, "restart", {"max_restarts", "carry_on", "elastic", "min_workers", "wait"});
    if (!restart) return;
    restart->Int("max_restarts", 0, kIntMax, &spec_.restart.max_restarts);
    ParseElastic(*restart);
    bool carry_on = false;
    if (restart->Bool("carry_on", &carry_on) == Read::kOk) {
      spec_.restart.carry_on = carry_on;
      if (carry_on && spec_.placement.shards()) {
        v_.Error(restart->Path("carry_on"),
                 absl::StrCat(
                     "not supported with placement.shard: ", ShardLevelName(spec_.placement.shard),
                     ": a lost replica's shard of the optimizer state exists nowhere "
                     "else (the job restarts from its checkpoint)"));
      }
    }
  }

  // restart.elastic: a bool, or a mapping {grow: bool} (elastic on); min_workers and wait only
  // with it. After ParsePlacement and ParseSchedule.
  void ParseElastic(const yaml_fields::Fields& restart) {
    RestartSpec& out = spec_.restart;
    const YAML::Node elastic = restart.Get("elastic");
    if (elastic.IsMap()) {
      auto fields = v_.Open(elastic, "restart.elastic", {"grow"});
      out.elastic = true;
      if (fields) fields->Bool("grow", &out.grow);
    } else if (restart.Has("elastic")) {
      restart.Bool("elastic", &out.elastic);
    }
    for (const char* key : {"min_workers", "wait"}) {
      if (restart.Has(key) && !out.elastic) {
        v_.Error(restart.Path(key), "only valid with restart.elastic");
      }
    }
    if (!out.elastic) return;
    if (out.max_restarts < 1) {
      v_.Error(restart.Path("elastic"),
               "needs restart.max_restarts >= 1 (shrinking onto fewer workers is a restart)");
    }
    if (!spec_.schedule.csv.empty()) {
      v_.Error(restart.Path("elastic"),
               "not supported with schedule.csv (a schedule file fixes the ranks; the job cannot "
               "be planned again on fewer)");
    }
    const int64_t workers =
        static_cast<int64_t>(spec_.placement.workers) * std::max(1, spec_.placement.replicas);
    if (restart.Int("min_workers", 1, kIntMax, &out.min_workers) == Read::kOk &&
        spec_.placement.workers > 0 && out.min_workers > workers) {
      v_.Error(
          restart.Path("min_workers"),
          absl::StrCat("must be <= the job's ", workers,
                       " workers (placement.workers x placement.replicas), got ", out.min_workers));
    }
    if (restart.Has("wait")) {
      const YAML::Node wait = restart.Get("wait");
      const std::string text = wait.IsScalar() ? wait.Scalar() : "";
      double seconds = 0;
      absl::Duration parsed;
      bool ok = false;
      if (absl::SimpleAtod(text, &seconds)) {
        ok = std::isfinite(seconds) && seconds >= 0;
        if (ok) parsed = absl::Seconds(seconds);
      } else if (absl::ParseDuration(text, &parsed)) {
        ok = parsed >= absl::ZeroDuration() && parsed < absl::InfiniteDuration();
      }
      if (ok) {
        out.wait = parsed;
      } else {
        v_.Error(restart.Path("wait"),
                 absl::StrCat("must be a duration >= 0 (\"30s\", \"2m\" or seconds), got ",
                              yaml_fields::Describe(wait)));
      }
    }
  }

  Validator v_;
  JobSpec spec_;
  bool builtin_ok_ = false;       // model.builtin is the model and is valid
  bool microbatches_ok_ = false;  // schedule.microbatches is valid or defaulted
  bool batch_size_ok_ = false;    // training.batch_size is given and valid
};

absl::Status Invalid(absl::string_view message) { return absl::InvalidArgumentError(message); }

}  // namespace

bool CarriesOn(const JobSpec& spec) {
  if (spec.placement.replicas <= 1) return false;
  return spec.restart.carry_on.value_or(!spec.placement.shards() && !spec.placement.shard_auto);
}

absl::StatusOr<JobSpec> ParseJobSpec(absl::string_view yaml_text, absl::string_view origin) {
  ASSIGN_OR_RETURN(std::vector<YAML::Node> documents,
                   LoadYamlDocuments(yaml_text, origin, /*max_documents=*/1));
  const std::string expected =
      absl::StrCat("a mapping with keys ", absl::StrJoin(TopLevelKeys(), ", "));
  if (documents.empty() || documents[0].IsNull()) {
    return Invalid(absl::StrCat(origin, ": the spec is empty; expected ", expected));
  }
  if (!documents[0].IsMap()) {
    return Invalid(
        absl::StrCat(origin, ": the spec must be ", expected, "; got ", Describe(documents[0])));
  }
  SpecParser parser;
  JobSpec spec;
  try {
    spec = parser.Parse(documents[0]);
  } catch (const YAML::Exception& e) {
    // Not expected: node types are checked before every access.
    return Invalid(absl::StrCat(origin, ": invalid YAML: ", e.msg));
  }
  if (!parser.errors().empty()) return Invalid(absl::StrJoin(parser.errors(), "\n"));
  return spec;
}

}  // namespace stagecoach::spec
