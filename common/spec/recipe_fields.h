// The training recipe's keys of the job spec (training.lr_schedule, training.grad_clip,
// training.max_skipped_steps, eval) and the `data` mapping both `data` and `eval.data` use, read
// through yaml_fields. spec_parser.cc calls these in its fixed order; the rules and defaults are
// in spec_parser.h's header comment and docs/spec.md.
//
// Each function reads one optional mapping (absent or null: defaults), reports every error on
// the Validator with its path, and writes only what it read validly. Not thread-safe: one
// Validator per parse.
#pragma once

#include <yaml-cpp/yaml.h>

#include <optional>
#include <string>

#include "common/spec/job_spec.h"
#include "common/spec/yaml_fields.h"

namespace stagecoach::spec::recipe_fields {

// training.lr_schedule: {kind: constant|linear|cosine, warmup_steps: int >= 0, min_lr: number
// in [0, base_lr]} (min_lr only with linear and cosine; base_lr is the optimizer's lr, checked
// against when base_lr_ok).
void ParseLrSchedule(yaml_fields::Validator& v, const YAML::Node& node, double base_lr,
                     bool base_lr_ok, LrScheduleSpec* out);

// training.grad_clip: {max_norm: number > 0} (required when grad_clip is given).
void ParseGradClip(yaml_fields::Validator& v, const YAML::Node& node,
                   std::optional<double>* max_norm);

// A data mapping at `path` ("data", "eval.data"): kind synthetic | tokens | tensors, path
// (required for tokens and tensors, refused for synthetic), seed, seq and dtype (uint16 |
// uint32; tokens only).
void ParseData(yaml_fields::Validator& v, const YAML::Node& node, const std::string& path,
               DataSpec* out);

// eval: {every_steps: int >= 1 (required), batches: int in [1, kMaxEvalBatches] (default 1),
// data: a data mapping (required)}. Absent or null: *out stays unset.
inline constexpr int64_t kMaxEvalBatches = 100000;
void ParseEval(yaml_fields::Validator& v, const YAML::Node& node, std::optional<EvalSpec>* out);

}  // namespace stagecoach::spec::recipe_fields
