#include "common/spec/hf_model_spec.h"

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/checkpoint/layout.h"
#include "common/hf/decoder_config.h"
#include "common/spec/builtin_model.h"
#include "common/spec/spec_parser.h"
#include "common/util/status_macros.h"

namespace stagecoach::spec {

namespace {

// DIR/config.json, parsed; errors prefixed with `field`.
absl::StatusOr<hf::DecoderConfig> ReadConfig(const std::string& dir, const std::string& field) {
  const std::string file = absl::StrCat(dir, "/config.json");
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", file, " cannot be read (a Hugging Face checkpoint directory holds "
        "config.json and the model's safetensors)"));
  }
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<hf::DecoderConfig> config = hf::ParseDecoderConfig(text.str(), file);
  if (!config.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", config.status().message()));
  }
  return config;
}

// training.resume_from naming a Hugging Face model directory (config.json, no manifest): a
// llama-family model of the same configuration starts from its weights, at step 0.
absl::Status ResolveResumeFromHf(JobSpec* spec) {
  const std::string dir = spec->training.resume_from;
  std::error_code ec;
  if (dir.empty() || !std::filesystem::exists(dir + "/config.json", ec) ||
      std::filesystem::exists(absl::StrCat(dir, "/", checkpoint::kManifestFileName), ec)) {
    return absl::OkStatus();
  }
  BuiltinModel* builtin = spec->model.builtin.has_value() ? &*spec->model.builtin : nullptr;
  if (builtin == nullptr || !builtin->decoder.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "training.resume_from: ", dir, " is a Hugging Face model directory, which only a "
        "llama-family model (model.builtin.family: llama or model.hf) starts from"));
  }
  ASSIGN_OR_RETURN(hf::DecoderConfig config, ReadConfig(dir, "training.resume_from"));
  hf::DecoderConfig mine = *builtin->decoder;
  config.torch_dtype = mine.torch_dtype;
  if (hf::DecoderConfigJson(config) != hf::DecoderConfigJson(mine)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "training.resume_from: ", dir, "/config.json describes another model than the job's: ",
        hf::DecoderConfigJson(config), " against ", hf::DecoderConfigJson(mine)));
  }
  builtin->weights_dir = dir;
  spec->training.resume_from.clear();
  return absl::OkStatus();
}

}  // namespace

absl::Status ResolveHfModel(JobSpec* spec) {
  if (!spec->model.hf.has_value()) return ResolveResumeFromHf(spec);
  const HfModelSpec& hf = *spec->model.hf;
  const std::string file = absl::StrCat(hf.path, "/config.json");
  ASSIGN_OR_RETURN(hf::DecoderConfig config, ReadConfig(hf.path, "model.hf"));
  const int64_t max_positions = config.max_position_embeddings;
  if (hf.seq > max_positions) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.hf.seq: must be <= max_position_embeddings of ", file, " (",
                     max_positions, "), got ", hf.seq));
  }
  BuiltinModel builtin = LlamaBuiltin(std::move(config), hf.seq > 0 ? hf.seq : max_positions);
  builtin.weights_dir = hf.path;
  spec->model.builtin = std::move(builtin);
  return ResolveResumeFromHf(spec);
}

absl::StatusOr<JobSpec> ReadJobSpec(absl::string_view yaml_text, absl::string_view origin) {
  ASSIGN_OR_RETURN(JobSpec spec, ParseJobSpec(yaml_text, origin));
  RETURN_IF_ERROR(ResolveHfModel(&spec));
  return spec;
}

}  // namespace stagecoach::spec
