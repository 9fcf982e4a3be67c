#include "coordinator/lifecycle/hf_weights_check.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/hf/decoder_tensors.h"
#include "common/safetensors/model_dir.h"

namespace stagecoach::coordinator {
namespace {

std::string Shape(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

bool FloatingPoint(safetensors::Dtype dtype) {
  return dtype == safetensors::Dtype::kF32 || dtype == safetensors::Dtype::kF16 ||
         dtype == safetensors::Dtype::kBF16 || dtype == safetensors::Dtype::kF64;
}

}  // namespace

absl::Status CheckHfWeights(const spec::JobSpec& spec) {
  if (!spec.model.builtin.has_value() || spec.model.builtin->weights_dir.empty()) {
    return absl::OkStatus();
  }
  if (!spec.model.builtin->decoder.has_value()) {
    return absl::InternalError("model.hf: its config.json has not been read");
  }
  const std::string& dir = spec.model.builtin->weights_dir;
  // Where the directory came from, for errors.
  const std::string field = spec.model.hf.has_value() ? "model.hf" : "training.resume_from";
  const hf::DecoderConfig& config = *spec.model.builtin->decoder;
  absl::StatusOr<safetensors::ModelDir> files = safetensors::ModelDir::Open(dir);
  if (!files.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", files.status().message()));
  }
  const std::string model = absl::StrCat("a ", config.model_type, " model of ", dir,
                                         "/config.json");
  std::set<std::string> expected;
  for (const hf::DecoderTensor& t : hf::DecoderTensors(config)) {
    expected.insert(t.hf_name);
    const safetensors::SafetensorsFile* file = nullptr;
    const safetensors::TensorInfo* info = files->Find(t.hf_name, &file);
    if (info == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": ", dir, " has no tensor ",
                                                     t.hf_name, ", which ", model, " needs (",
                                                     Shape(t.shape), ")"));
    }
    if (info->shape != t.shape) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": tensor ", t.hf_name, " in ", file->path(), " has shape ",
                       Shape(info->shape), "; ", model, " needs ", Shape(t.shape)));
    }
    if (!FloatingPoint(info->dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": tensor ", t.hf_name, " in ", file->path(), " is ",
          safetensors::DtypeName(info->dtype), ", not a floating-point dtype (F32, F16, BF16, F64)"));
    }
  }
  for (const std::string& name : files->Names()) {
    if (expected.count(name) > 0) continue;
    const safetensors::SafetensorsFile* file = nullptr;
    files->Find(name, &file);
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", file != nullptr ? file->path() : dir, " holds tensor ", name, ", which ",
        model, " does not have",
        name == "lm_head.weight" ? " (its tie_word_embeddings makes the head the embedding)" : ""));
  }
  return absl::OkStatus();
}

}  // namespace stagecoach::coordinator
