// The header that travels ahead of an activation when microbatch shapes vary from step to step
// (ExecutorOptions::dynamic_shapes): its dtype and its sizes, so that the consumer's rank
// allocates the receive buffer for exactly what comes.
//
// Contract:
// - A header is kShapeHeaderWords int64 words: [dtype, ndim, d0 .. d(kShapeHeaderDims-1)], the
//   unused sizes zero. It is sent on the boundary's shape link (Payload::kShapes) with the tag
//   ShapeHeaderTag, before the activation it describes; headers and activations of one edge
//   pair up in the same order.
// - A value's actual shape must fit what AgreeShapes planned for it: the same dtype and number
//   of dimensions, no size larger (the planned shapes are the largest the job's data makes, and
//   the memory model planned for them). FitsPlanned says which size of what is too large.
// - A gradient needs no header: it has the shape of the activation it is for, which its
//   receiver (the activation's producer) sent.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/runtime/executor/pipeline_executor.h"

namespace stagecoach::runtime {

constexpr int kShapeHeaderDims = 8;
constexpr int kShapeHeaderWords = 2 + kShapeHeaderDims;

// The tag of the header of the values stage `producer` sends stage `consumer` for `microbatch`.
// (Microbatch field + 1: field 0 is the set-up's shape message of that pair.)
uint64_t ShapeHeaderTag(int producer, int consumer, int microbatch);

// `meta` as a header: a CPU int64 tensor of kShapeHeaderWords. INVALID_ARGUMENT past
// kShapeHeaderDims dimensions.
absl::StatusOr<torch::Tensor> EncodeShapeHeader(const TensorMeta& meta);

// The meta a received header describes (requires_grad false). DATA_LOSS for a header no
// EncodeShapeHeader wrote (an unknown dtype, a negative size, too many dimensions).
absl::StatusOr<TensorMeta> DecodeShapeHeader(const torch::Tensor& words);

// OK when `actual` may stand for `planned` (see the file comment); otherwise INVALID_ARGUMENT
// "<what> is <actual> but <planned> was planned: <why>".
absl::Status FitsPlanned(const TensorMeta& actual, const TensorMeta& planned,
                         const std::string& what);

}  // namespace stagecoach::runtime
