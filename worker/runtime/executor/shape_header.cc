#include "worker/runtime/executor/shape_header.h"

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"
#include "worker/runtime/executor/message_tags.h"

namespace stagecoach::runtime {

uint64_t ShapeHeaderTag(int producer, int consumer, int microbatch) {
  return MessageTag(Payload::kShapes, PairEdge(producer, consumer), microbatch + 1);
}

absl::StatusOr<torch::Tensor> EncodeShapeHeader(const TensorMeta& meta) {
  if (meta.shape.size() > kShapeHeaderDims) {
    return absl::InvalidArgumentError(
        absl::StrCat(meta.ToString(), " has more than ", kShapeHeaderDims, " dimensions"));
  }
  torch::Tensor words = torch::zeros({kShapeHeaderWords}, torch::kInt64);
  int64_t* w = words.data_ptr<int64_t>();
  w[0] = static_cast<int64_t>(meta.dtype);
  w[1] = static_cast<int64_t>(meta.shape.size());
  for (size_t d = 0; d < meta.shape.size(); ++d) w[2 + d] = meta.shape[d];
  return words;
}

absl::StatusOr<TensorMeta> DecodeShapeHeader(const torch::Tensor& words) {
  if (words.scalar_type() != torch::kInt64 || words.numel() != kShapeHeaderWords) {
    return absl::DataLossError(
        absl::StrCat("a shape header is ", kShapeHeaderWords, " int64 words, got ", words.numel()));
  }
  const torch::Tensor cpu = words.to(torch::kCPU).contiguous();
  const int64_t* w = cpu.data_ptr<int64_t>();
  if (w[0] < 0 || w[0] >= static_cast<int64_t>(torch::ScalarType::NumOptions)) {
    return absl::DataLossError(absl::StrCat("a shape header names dtype ", w[0]));
  }
  if (w[1] < 0 || w[1] > kShapeHeaderDims) {
    return absl::DataLossError(absl::StrCat("a shape header has ", w[1], " dimensions"));
  }
  TensorMeta meta;
  meta.dtype = static_cast<torch::ScalarType>(w[0]);
  for (int64_t d = 0; d < w[1]; ++d) {
    if (w[2 + d] < 0) {
      return absl::DataLossError(absl::StrCat("a shape header has size ", w[2 + d]));
    }
    meta.shape.push_back(w[2 + d]);
  }
  return meta;
}

absl::StatusOr<torch::Tensor> FrameWithHeader(const torch::Tensor& value, const TensorMeta& meta) {
  ASSIGN_OR_RETURN(torch::Tensor words, EncodeShapeHeader(meta));
  const torch::Tensor bytes = value.detach().contiguous().view({-1}).view(torch::kUInt8);
  torch::Tensor frame =
      torch::empty({kShapeHeaderBytes + bytes.numel()}, bytes.options().dtype(torch::kUInt8));
  frame.narrow(0, 0, kShapeHeaderBytes).copy_(words.view(torch::kUInt8));
  frame.narrow(0, kShapeHeaderBytes, bytes.numel()).copy_(bytes);
  return frame;
}

absl::StatusOr<UnframedValue> UnframeValue(const torch::Tensor& received) {
  if (received.scalar_type() != torch::kUInt8 || received.dim() != 1 ||
      received.numel() < kShapeHeaderBytes) {
    return absl::DataLossError(absl::StrCat(
        "a framed value is a byte buffer of at least ", kShapeHeaderBytes, " bytes, got ",
        c10::toString(received.scalar_type()), " of ", received.numel(), " elements"));
  }
  ASSIGN_OR_RETURN(TensorMeta meta,
                   DecodeShapeHeader(received.narrow(0, 0, kShapeHeaderBytes).view(torch::kInt64)));
  int64_t numel = 1;
  for (int64_t d : meta.shape) numel *= d;
  const int64_t bytes = numel * static_cast<int64_t>(c10::elementSize(meta.dtype));
  if (bytes > received.numel() - kShapeHeaderBytes) {
    return absl::DataLossError(absl::StrCat(
        "a shape header describes ", meta.ToString(), " (", bytes, " bytes), more than the ",
        received.numel() - kShapeHeaderBytes, " bytes received after it"));
  }
  torch::Tensor value =
      received.narrow(0, kShapeHeaderBytes, bytes).view(meta.dtype).view(meta.shape);
  return UnframedValue{std::move(meta), std::move(value)};
}

absl::Status FitsPlanned(const TensorMeta& actual, const TensorMeta& planned,
                         const std::string& what) {
  auto refuse = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is ", actual.ToString(), " but ",
                                                   planned.ToString(), " was planned: ", why));
  };
  if (actual.dtype != planned.dtype) return refuse("another dtype");
  if (actual.shape.size() != planned.shape.size()) return refuse("another number of dimensions");
  for (size_t d = 0; d < actual.shape.size(); ++d) {
    if (actual.shape[d] > planned.shape[d]) {
      return refuse(absl::StrCat("dimension ", d, " is larger than planned (the memory plan is ",
                                 "for the largest shape)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace stagecoach::runtime
