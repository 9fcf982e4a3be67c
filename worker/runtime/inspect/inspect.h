// InspectModel: what the coordinator's planner needs to know of a job's model, measured by a
// worker (the coordinator never loads LibTorch): the model's ordered layers with their parameter
// counts (a TorchScript model opened toward the spec's split.points: torchscript_model.h "Nested
// layers"), the split points it offers (the layers, and for a TorchScript model the modules
// holding them and those they call, at any depth), whether its forward is a plain chain, the
// model file's SHA-256 and, when asked, each layer's forward and backward time on one
// microbatch of the spec's data.
//
// Profiling. The model is cut at every layer (one stage per layer, wired as the pipeline wires
// stages). The first microbatch of step 0's batch (training.batch_size rows split into
// schedule.microbatches) runs through the layers in order, each layer's inputs detached and,
// when floating point, requiring grad, as a pipeline stage receives them; then backward runs
// layer by layer, last first: the last layer's output gets a gradient of ones, every other
// output the sum of the gradients its consumers computed for it. Each layer's forward and
// backward are timed apart: one warm-up, then `iterations` timed repeats, of which the fastest
// is reported, the one least disturbed by other processes (CUDA work is synchronised before the
// clock stops). The split backward of the
// zero-bubble schedules is timed too, I (input gradient) and W (weight gradients) apart, on a
// fresh forward (LayerInfo.backward_input_seconds, backward_weight_seconds), in the same repeats
// as the fused backward, so that load from another process slows both alike. On
// CPU each layer's forward then runs once more under the process's counting allocator
// (installed if it was not), to record the bytes it keeps for the backward, the most it
// allocates beyond those and its output's bytes, its backward once more for the most that
// allocates, and its split backward once more for what is live between I and W
// (LayerInfo.activation_bytes, forward_transient_bytes, output_bytes, backward_transient_bytes,
// weight_pending_bytes; 0 on CUDA).
//
// Torch-free header: the worker's service includes it.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "stagecoach/v1/worker.pb.h"

namespace stagecoach::model {

// Timed repetitions of each layer when the caller gives none.
constexpr int kDefaultProfileIterations = 3;

// Inspects the model of `spec`. `model_path` is model.torchscript resolved to a local file
// (ignored for a built-in model); data.path in `spec`, read when profiling, must already be a
// local path. `device` is "cpu" or "cuda:N" (where the profile runs); `iterations` <= 0 means
// kDefaultProfileIterations. A built-in model's layers are its spec's (names as
// spec::BuiltinLayerNames, no file: model_sha256 empty, sequential true).
// INVALID_ARGUMENT naming the field: model.torchscript for a file that cannot be read or loaded
// or has no layer, data.* for data that cannot be read for the model, model.* for a model
// whose layers fail to run on that data (naming the layer and LibTorch's message).
// Blocking (profiling runs every layer 1 + iterations times forward and backward); thread-safe
// (callers run it on a thread of its own).
absl::StatusOr<v1::InspectModelResponse> InspectModel(const spec::JobSpec& spec, bool profile,
                                                      int iterations, const std::string& model_path,
                                                      const std::string& device);

}  // namespace stagecoach::model
