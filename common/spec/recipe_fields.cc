#include "common/spec/recipe_fields.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace stagecoach::spec::recipe_fields {
namespace {

using yaml_fields::Fields;
using yaml_fields::Read;
using yaml_fields::Validator;

constexpr int64_t kIntMax = std::numeric_limits<int>::max();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

}  // namespace

void ParseLrSchedule(Validator& v, const YAML::Node& node, double base_lr, bool base_lr_ok,
                     LrScheduleSpec* out) {
  auto fields = v.Open(node, "training.lr_schedule", {"kind", "warmup_steps", "min_lr"});
  if (!fields) return;
  const Read kind = fields->Enum("kind", {"constant", "linear", "cosine"}, &out->kind);
  fields->Int("warmup_steps", 0, kInt64Max, &out->warmup_steps);
  double min_lr = 0;
  if (fields->Number("min_lr", &min_lr) != Read::kOk) return;
  const std::string got = fields->Get("min_lr").Scalar();
  if (kind != Read::kInvalid && out->kind == "constant") {
    v.Error(fields->Path("min_lr"), "only used by lr_schedule kind linear or cosine");
  } else if (min_lr < 0) {
    v.Error(fields->Path("min_lr"), absl::StrCat("must be >= 0, got ", got));
  } else if (base_lr_ok && min_lr > base_lr) {
    v.Error(fields->Path("min_lr"),
            absl::StrCat("must be <= training.optimizer.lr (", base_lr, "), got ", got));
  } else {
    out->min_lr = min_lr;
  }
}

void ParseGradClip(Validator& v, const YAML::Node& node, std::optional<double>* max_norm) {
  if (!node.IsDefined() || node.IsNull()) return;
  auto fields = v.Open(node, "training.grad_clip", {"max_norm"});
  if (!fields) return;
  double value = 0;
  switch (fields->Number("max_norm", &value)) {
    case Read::kAbsent:
      v.Error(fields->Path("max_norm"), "required with training.grad_clip");
      return;
    case Read::kInvalid:
      return;
    case Read::kOk:
      break;
  }
  if (value <= 0) {
    v.Error(fields->Path("max_norm"),
            absl::StrCat("must be > 0, got ", fields->Get("max_norm").Scalar()));
    return;
  }
  *max_norm = value;
}

namespace {

// data.tokenizer, data.fields and data.overlong: for kind jsonl only, the tokenizer required.
void ParseJsonlFields(Validator& v, Fields& data, const std::string& path, bool kind_ok,
                      DataSpec* out) {
  const bool jsonl = out->kind == "jsonl";
  const Read tokenizer = data.String("tokenizer", &out->tokenizer);
  if (tokenizer == Read::kOk && out->tokenizer.empty()) {
    v.Error(data.Path("tokenizer"), "must be a non-empty path");
  }
  if (kind_ok && jsonl && tokenizer == Read::kAbsent) {
    v.Error(data.Path("tokenizer"),
            absl::StrCat("required for ", path, ".kind jsonl (the records' SentencePiece model)"));
  }
  const Read overlong = data.Enum("overlong", {"truncate", "skip", "fail"}, &out->overlong);
  if (data.Has("fields")) {
    auto fields = v.Open(data.Get("fields"), data.Path("fields"), {"prompt", "response"});
    if (fields) {
      for (auto [key, value] : {std::pair<const char*, std::string*>{"prompt", &out->prompt_field},
                                {"response", &out->response_field}}) {
        if (fields->String(key, value) == Read::kOk && value->empty()) {
          v.Error(fields->Path(key), "must be a non-empty key");
        }
      }
    }
  }
  if (!kind_ok || jsonl) return;
  for (auto [key, given] : {std::pair<const char*, bool>{"tokenizer", tokenizer != Read::kAbsent},
                            {"fields", data.Has("fields")},
                            {"overlong", overlong != Read::kAbsent}}) {
    if (given) v.Error(data.Path(key), absl::StrCat("only used by ", path, ".kind jsonl"));
  }
}

}  // namespace

void ParseData(Validator& v, const YAML::Node& node, const std::string& path, DataSpec* out) {
  auto data = v.Open(node, path,
                     {"kind", "path", "seed", "seq", "dtype", "packing", "eos", "tokenizer",
                      "fields", "overlong"});
  if (!data) return;
  const Read kind = data->Enum("kind", {"synthetic", "tokens", "jsonl", "tensors"}, &out->kind);
  const Read file = data->String("path", &out->path);
  if (file == Read::kOk && out->path.empty()) {
    v.Error(data->Path("path"), "must be a non-empty path");
  }
  if (kind != Read::kInvalid) {
    if (out->kind == "synthetic" && file != Read::kAbsent) {
      v.Error(data->Path("path"),
              absl::StrCat("not used by ", path, ".kind synthetic (use kind tokens or tensors)"));
    } else if (out->kind != "synthetic" && file == Read::kAbsent) {
      v.Error(data->Path("path"), absl::StrCat("required for ", path, ".kind ", out->kind));
    }
  }
  data->Uint("seed", &out->seed);
  const Read seq = data->Int("seq", 1, kIntMax, &out->seq);
  if (seq == Read::kOk && kind != Read::kInvalid && !IsTokenData(*out)) {
    v.Error(data->Path("seq"), absl::StrCat("only used by ", path, ".kind tokens or jsonl"));
  }
  const Read dtype = data->Enum("dtype", {"uint16", "uint32"}, &out->dtype);
  if (dtype == Read::kOk && kind != Read::kInvalid && out->kind != "tokens") {
    v.Error(data->Path("dtype"), absl::StrCat("only used by ", path, ".kind tokens"));
  }
  const Read packing = data->Enum("packing", {"pad", "pack"}, &out->packing);
  if (packing == Read::kOk && kind != Read::kInvalid && !IsTokenData(*out)) {
    v.Error(data->Path("packing"), absl::StrCat("only used by ", path, ".kind tokens or jsonl"));
  }
  ParseJsonlFields(v, *data, path, kind != Read::kInvalid, out);
  if (out->kind == "jsonl" && packing == Read::kAbsent) out->packing = "pack";
  int64_t eos = 0;
  const Read eos_read = data->Int("eos", 0, kInt64Max, &eos);
  if (eos_read == Read::kOk) {
    out->eos = eos;
    if (kind != Read::kInvalid && out->kind != "tokens") {
      v.Error(data->Path("eos"), absl::StrCat("only used by ", path, ".kind tokens"));
    }
  }
  if (eos_read == Read::kOk && packing == Read::kAbsent) out->packing = "pack";
}

void ParseEval(Validator& v, const YAML::Node& node, std::optional<EvalSpec>* out) {
  if (!node.IsDefined() || node.IsNull()) return;
  auto fields = v.Open(node, "eval", {"every_steps", "batches", "data"});
  if (!fields) return;
  EvalSpec eval;
  if (fields->Int("every_steps", 1, kInt64Max, &eval.every_steps) == Read::kAbsent) {
    v.Error(fields->Path("every_steps"), "required with eval");
  }
  fields->Int("batches", 1, kMaxEvalBatches, &eval.batches);
  if (!fields->Has("data")) {
    v.Error(fields->Path("data"), "required with eval (the held-out data)");
  } else {
    ParseData(v, fields->Get("data"), fields->Path("data"), &eval.data);
  }
  *out = eval;
}

}  // namespace stagecoach::spec::recipe_fields
