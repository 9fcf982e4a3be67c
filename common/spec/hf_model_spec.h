// model.hf's files, read: ReadJobSpec parses a spec (spec_parser.h) and, for a model given as a
// Hugging Face checkpoint directory, reads DIR/config.json (common/hf/decoder_config.h) into
// model.builtin: family llama with the file's configuration, `seq` (model.hf.seq, default the
// configuration's max_position_embeddings) and weights_dir DIR. And a training.resume_from that
// names a Hugging Face model directory (config.json and no manifest.json, such as a checkpoint's
// hf/ export) makes a llama-family model of the same configuration start from its weights at
// step 0: weights_dir becomes that directory and resume_from is cleared. Everything that plans
// or runs a job reads its spec this way; ParseJobSpec alone reads no file.
//
// Errors: INVALID_ARGUMENT naming model.hf and the file: a directory without config.json, a
// config the family does not cover (another model_type, named), seq over
// max_position_embeddings; a resume_from directory of another configuration or for a model
// outside the family (naming training.resume_from). Thread-safe.
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
