// The header that tells an activation's consumer its shape when microbatch shapes vary from step
// to step (ExecutorOptions::dynamic_shapes): the value's dtype and its sizes.
//
// Contract:
// - A header is kShapeHeaderWords int64 words: [dtype, ndim, d0 .. d(kShapeHeaderDims-1)], the
//   unused sizes zero.
// - It travels one of two ways, by what the transport can do:
//   - framed (BackendCapabilities::shorter_receives, Gloo): at the front of the value's own
//     message, [header | value bytes], kShapeHeaderBytes then the value. The consumer posts one
//     receive of at most kShapeHeaderBytes + the planned value's bytes at RECV_F, so the value
//     travels as soon as it is sent and costs no message of its own (FrameWithHeader,
//     UnframeValue).
//   - ahead (a transport that takes only exact receives, NCCL): on the boundary's shape link
//     (Payload::kShapes) with the tag ShapeHeaderTag, before the activation it describes;
//     headers and activations of one edge pair up in the same order. The consumer allocates the
//     value's buffer once the header is in.
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
// A framed value starts this many bytes into its message: a multiple of every dtype's size, so
// the value's view of the received bytes is aligned.
constexpr int64_t kShapeHeaderBytes = kShapeHeaderWords * static_cast<int64_t>(sizeof(int64_t));

// The tag of the header of the values stage `producer` sends stage `consumer` for `microbatch`.
// (Microbatch field + 1: field 0 is the set-up's shape message of that pair.)
uint64_t ShapeHeaderTag(int producer, int consumer, int microbatch);

// `meta` as a header: a CPU int64 tensor of kShapeHeaderWords. INVALID_ARGUMENT past
// kShapeHeaderDims dimensions.
absl::StatusOr<torch::Tensor> EncodeShapeHeader(const TensorMeta& meta);

// The meta a received header describes (requires_grad false). DATA_LOSS for a header no
// EncodeShapeHeader wrote (an unknown dtype, a negative size, too many dimensions).
absl::StatusOr<TensorMeta> DecodeShapeHeader(const torch::Tensor& words);

// `value` framed for sending: a byte tensor on the value's device, kShapeHeaderBytes of header
// (describing `meta`, which must be `value`'s meta) then the value's bytes. INVALID_ARGUMENT past
// kShapeHeaderDims dimensions.
absl::StatusOr<torch::Tensor> FrameWithHeader(const torch::Tensor& value, const TensorMeta& meta);

// A framed message's value as its header describes it, and that meta (requires_grad false):
// a view of `received`'s bytes after the header, nothing copied. `received` is the byte buffer
// the receive was posted with (at least the sender's frame; the rest unused). DATA_LOSS for a
// header no FrameWithHeader wrote, or one describing more bytes than `received` holds.
struct UnframedValue {
  TensorMeta meta;
  torch::Tensor value;
};
absl::StatusOr<UnframedValue> UnframeValue(const torch::Tensor& received);

// OK when `actual` may stand for `planned` (see the file comment); otherwise INVALID_ARGUMENT
// "<what> is <actual> but <planned> was planned: <why>".
absl::Status FitsPlanned(const TensorMeta& actual, const TensorMeta& planned,
                         const std::string& what);

}  // namespace stagecoach::runtime
