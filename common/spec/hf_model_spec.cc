#include "common/spec/hf_model_spec.h"

#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/hf/decoder_config.h"
#include "common/spec/spec_parser.h"
#include "common/util/status_macros.h"

namespace stagecoach::spec {

absl::Status ResolveHfModel(JobSpec* spec) {
  if (!spec->model.hf.has_value()) return absl::OkStatus();
  const HfModelSpec& hf = *spec->model.hf;
  const std::string file = absl::StrCat(hf.path, "/config.json");
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.hf.path: ", file, " cannot be read (a Hugging Face checkpoint directory holds "
        "config.json and the model's safetensors)"));
  }
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<hf::DecoderConfig> config = hf::ParseDecoderConfig(text.str(), file);
  if (!config.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("model.hf: ", config.status().message()));
  }
  BuiltinModel builtin;
  builtin.family = "llama";
  builtin.seq = hf.seq > 0 ? hf.seq : config->max_position_embeddings;
  if (builtin.seq > config->max_position_embeddings) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.hf.seq: must be <= max_position_embeddings of ", file, " (",
                     config->max_position_embeddings, "), got ", hf.seq));
  }
  builtin.vocab = config->vocab_size;
  builtin.d_model = config->hidden_size;
  builtin.layers = config->num_hidden_layers;
  builtin.heads = config->num_attention_heads;
  builtin.tie_embeddings = config->tie_word_embeddings;
  builtin.decoder = *std::move(config);
  builtin.weights_dir = hf.path;
  spec->model.builtin = std::move(builtin);
  return absl::OkStatus();
}

absl::StatusOr<JobSpec> ReadJobSpec(absl::string_view yaml_text, absl::string_view origin) {
  ASSIGN_OR_RETURN(JobSpec spec, ParseJobSpec(yaml_text, origin));
  RETURN_IF_ERROR(ResolveHfModel(&spec));
  return spec;
}

}  // namespace stagecoach::spec
