// model.hf's files, read: ReadJobSpec parses a spec (spec_parser.h) and, for a model given as a
// Hugging Face checkpoint directory, reads DIR/config.json (common/hf/decoder_config.h) into
// model.builtin: family llama with the file's configuration, `seq` (model.hf.seq, default the
// configuration's max_position_embeddings) and weights_dir DIR. Everything that plans or runs a
// job reads its spec this way; ParseJobSpec alone reads no file.
//
// Errors: INVALID_ARGUMENT naming model.hf and the file: a directory without config.json, a
// config the family does not cover (another model_type, named), seq over
// max_position_embeddings. Thread-safe.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/spec/job_spec.h"

namespace stagecoach::spec {

// Fills spec->model.builtin from spec->model.hf; nothing when the model is not model.hf.
absl::Status ResolveHfModel(JobSpec* spec);

// ParseJobSpec, then ResolveHfModel.
absl::StatusOr<JobSpec> ReadJobSpec(absl::string_view yaml_text, absl::string_view origin = "spec");

}  // namespace stagecoach::spec
