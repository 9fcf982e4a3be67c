// Parsing and validation of the user's YAML job spec (DESIGN.md "Spec (YAML)").
//
// ParseJobSpec is strict: every key must be known, every value must have its type, and every
// rule below holds, or the spec is rejected with all its errors at once.
//
// Errors. INVALID_ARGUMENT whose message has one line per error, in a fixed order (top-level
// keys in the order below, a mapping's key errors before its values' errors, cross-field checks
// last), each `<field path>: <reason>`:
//   schedule.microbatches: must be >= 1, got 0
//   training.loss: must be one of mse, cross_entropy, got 'l1'
//   model.builtin.sizes[2]: must be >= 1, got 0
//   split.points.layers.4: must be 'beginning' or 'end', got 'middle'
//   split.polcy: unknown key (valid keys: stages, points, policy); did you mean 'policy'?
// Paths join mapping keys with '.' and index sequences with [i]. An unknown key (or an unknown
// layer name in split.points) is suggested the closest valid one when that is within edit
// distance 2 (transpositions count 1), closer than the key's own length, and the only one so close.
// A YAML syntax error is one line `<origin>:<line>:<column>: invalid YAML: <yaml-cpp's message>`
// (1-based); an empty document, a document that is not a mapping, or more than one document is
// one line starting `<origin>: `.
//
// Scalars (YAML 1.2 core schema, unquoted):
//   integer  [-+]?[0-9]+, 0x[0-9a-fA-F]+ or 0o[0-7]+; 2.5 or '8' (quoted) is not an integer; a
//            value outside the field's range (for 64-bit fields, outside int64) is an error, never
//            a wraparound.
//   number   an integer or a decimal float (1, 0.5, 3.0e-4, 1e-3); .inf and .nan are rejected.
//   bool     true/True/TRUE/false/False/FALSE (not yes/no/on/off).
//   string   any scalar, quoted or not.
// A key whose value is null (`key:` or `key: ~`) counts as absent, so an empty section takes
// its defaults. Duplicate keys and non-scalar or empty keys are errors.
//
// Rules (defaults in JobSpec where not stated):
//   name        required; [a-z0-9]([a-z0-9-]*[a-z0-9])?, at most 63 characters.
//   model       exactly one of `torchscript` (non-empty string) or `builtin`:
//               builtin.family mlp | gpt | llama (required);
//               mlp: sizes, a list of >= 2 integers each >= 1;
//               gpt: vocab, d_model, layers, heads, seq, integers in [1, 2147483647], all
//                    required, d_model divisible by heads; tie_embeddings: bool, default false;
//               llama: Hugging Face config.json keys and seq (builtin_fields.h lists them);
//               seed: integer in [0, 2^64), default 0. A key of another family is an error.
//   split       stages: integer >= 1 (0 in JobSpec when absent); points: non-empty mapping of
//               layer name -> beginning | end; stages and points are mutually exclusive;
//               policy: equal-layers (default) | equal-params | profiled. For a builtin model,
//               stages <= BuiltinLayerCount and every point is one of BuiltinLayerNames.
//   schedule    required; exactly one of `kind` (non-empty; the generator name is checked by the
//               planner) or `csv` (non-empty path); microbatches: integer >= 1, default 1;
//               csv_format: compute_only (default) | compute_comms, and csv_text (string, the
//               file's contents inlined by stagectl) only with csv.
//   placement   workers: integer >= 1 (0 when absent); device: cpu (default) | cuda;
//               style: loop | v (empty when absent); transport: auto (default) | a backend
//               registered in common/transport/backends.h (gloo, nccl), one that needs CUDA
//               (nccl) only with device cuda.
//   training    batch_size: integer >= 1, required; steps: integer >= 1, default 1;
//               loss: mse (default) | cross_entropy; scale_grads: bool, default true;
//               optimizer.kind: sgd (default) | adamw;
//               optimizer.lr: number > 0, default 0.01 (sgd) / 0.001 (adamw);
//               optimizer.weight_decay: number >= 0, default 0 (sgd) / 0.01 (adamw);
//               optimizer.momentum: number in [0, 1), sgd only, default 0;
//               optimizer.betas: list of two numbers each in [0, 1), adamw only, default
//               [0.9, 0.999]; optimizer.eps: number > 0, adamw only, default 1e-8;
//               checkpoint.dir: string; checkpoint.every_steps: integer >= 0, only with dir;
//               lr_schedule.kind: constant (default) | linear | cosine;
//               lr_schedule.warmup_steps: integer >= 0, default 0; lr_schedule.min_lr: number
//               in [0, optimizer.lr], linear and cosine only, default 0;
//               grad_clip.max_norm: number > 0, required with grad_clip (unset: no clipping);
//               max_skipped_steps: integer >= 1, default 10;
//               activation_checkpointing: none (default) | full;
//               precision: fp32 (default) | bf16.
//   data        kind: synthetic (default) | tokens | tensors; path: non-empty, required for
//               tokens and tensors and not allowed for synthetic; seed: integer in [0, 2^64);
//               seq: integer >= 1, tokens only.
//   restart     max_restarts: integer >= 0, default 0. carry_on: bool (default: true with
//               placement.replicas > 1 unless placement.shard_optimizer; true with
//               shard_optimizer is refused). elastic: bool, or a mapping {grow: bool} meaning
//               true (default false; needs max_restarts >= 1; not with schedule.csv);
//               min_workers: integer in [1, placement.workers x placement.replicas], default
//               1, and wait: a duration ("30s", "2m" or seconds) >= 0, default 60s, only with
//               elastic; grow: bool, default true.
//   eval        every_steps: integer >= 1, required; batches: integer in [1, 100000],
//               default 1; data: a mapping with data's keys and rules, required.
//   cross-field schedule.microbatches <= training.batch_size.
// Integer fields stored as `int` (split.stages, schedule.microbatches, placement.workers,
// restart.max_restarts) are at most 2147483647; 64-bit ones at most 9223372036854775807.
//
// Thread safety: all functions are pure and may be called concurrently.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/spec/builtin_model.h"
#include "common/spec/job_spec.h"

namespace stagecoach::spec {

// Parses and validates `yaml_text`. `origin` (a file name, say) prefixes document-level errors
// (YAML syntax, empty document, not a mapping). On success every field of the JobSpec is set:
// given values, or the defaults above.
absl::StatusOr<JobSpec> ParseJobSpec(absl::string_view yaml_text,
                                     absl::string_view origin = "spec");

}  // namespace stagecoach::spec
