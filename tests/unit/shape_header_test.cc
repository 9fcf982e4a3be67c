// The shape header of ragged activations (worker/runtime/executor/shape_header.h): a framed value
// comes back bit for bit as a view of the received bytes, whatever its dtype and however much of
// the posted buffer it fills; a frame or header that no sender wrote is refused as DATA_LOSS
// naming what is wrong; a value larger than planned is refused naming the dimension.
#include "worker/runtime/executor/shape_header.h"

#include <torch/torch.h>

#include "gtest/gtest.h"

namespace stagecoach::runtime {
namespace {

// `frame` received into a byte buffer of the frame's bytes plus `spare` unused ones.
torch::Tensor Received(const torch::Tensor& frame, int64_t spare) {
  torch::Tensor buffer = torch::full({frame.numel() + spare}, 0xAB, torch::kUInt8);
  buffer.narrow(0, 0, frame.numel()).copy_(frame);
  return buffer;
}

TEST(ShapeHeaderTest, AFramedValueComesBackAsAViewOfTheReceivedBytes) {
  for (torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16, torch::kInt64,
                                  torch::kFloat64}) {
    const torch::Tensor value = (torch::randn({3, 5, 7}) * 100).to(dtype);
    const TensorMeta meta{{3, 5, 7}, dtype};
    auto frame = FrameWithHeader(value, meta);
    ASSERT_TRUE(frame.ok()) << frame.status();
    EXPECT_EQ(frame->numel(), kShapeHeaderBytes + value.nbytes());
    const torch::Tensor received = Received(*frame, 333);
    auto unframed = UnframeValue(received);
    ASSERT_TRUE(unframed.ok()) << unframed.status();
    EXPECT_EQ(unframed->meta.dtype, dtype);
    EXPECT_EQ(unframed->meta.shape, (std::vector<int64_t>{3, 5, 7}));
    EXPECT_TRUE(torch::equal(unframed->value, value)) << c10::toString(dtype);
    // No copy: the value is the received bytes after the header.
    EXPECT_EQ(static_cast<const char*>(unframed->value.data_ptr()),
              static_cast<const char*>(received.data_ptr()) + kShapeHeaderBytes);
  }
}

TEST(ShapeHeaderTest, ANonContiguousOrEmptyValueIsFramedAsItsContiguousBytes) {
  const torch::Tensor value = torch::arange(24, torch::kFloat32).view({4, 6}).t();
  auto frame = FrameWithHeader(value, TensorMeta{{6, 4}, torch::kFloat32});
  ASSERT_TRUE(frame.ok());
  auto unframed = UnframeValue(*frame);
  ASSERT_TRUE(unframed.ok()) << unframed.status();
  EXPECT_TRUE(torch::equal(unframed->value, value));

  const torch::Tensor empty = torch::zeros({2, 0}, torch::kInt64);
  frame = FrameWithHeader(empty, TensorMeta{{2, 0}, torch::kInt64});
  ASSERT_TRUE(frame.ok());
  unframed = UnframeValue(*frame);
  ASSERT_TRUE(unframed.ok()) << unframed.status();
  EXPECT_EQ(unframed->value.sizes(), empty.sizes());
}

TEST(ShapeHeaderTest, FramesAndHeadersNoSenderWroteAreDataLoss) {
  auto frame = FrameWithHeader(torch::ones({4, 4}), TensorMeta{{4, 4}, torch::kFloat32});
  ASSERT_TRUE(frame.ok());
  // Fewer bytes after the header than it describes.
  absl::StatusOr<UnframedValue> u = UnframeValue(frame->narrow(0, 0, frame->numel() - 4));
  EXPECT_EQ(u.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(u.status().message().find("Float[4, 4] (64 bytes), more than the 60 bytes"),
            std::string::npos)
      << u.status();
  // Shorter than a header, or not bytes.
  u = UnframeValue(torch::zeros({kShapeHeaderBytes - 1}, torch::kUInt8));
  EXPECT_EQ(u.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(u.status().message().find("at least 80 bytes"), std::string::npos) << u.status();
  EXPECT_EQ(UnframeValue(torch::zeros({kShapeHeaderWords}, torch::kInt64)).status().code(),
            absl::StatusCode::kDataLoss);
  // A header's words out of range: dtype, number of dimensions, a size.
  for (auto [word, value, says] : std::vector<std::tuple<int, int64_t, std::string>>{
           {0, 99, "names dtype 99"}, {1, 9, "has 9 dimensions"}, {3, -2, "has size -2"}}) {
    torch::Tensor bad = frame->clone();
    bad.narrow(0, 0, kShapeHeaderBytes).view(torch::kInt64)[word] = value;
    u = UnframeValue(bad);
    EXPECT_EQ(u.status().code(), absl::StatusCode::kDataLoss) << says;
    EXPECT_NE(u.status().message().find(says), std::string::npos) << u.status();
  }
}

TEST(ShapeHeaderTest, MoreDimensionsThanAHeaderHoldsAreRefusedWhenFraming) {
  const std::vector<int64_t> nine(kShapeHeaderDims + 1, 1);
  auto frame = FrameWithHeader(torch::zeros(nine), TensorMeta{nine, torch::kFloat32});
  EXPECT_EQ(frame.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(frame.status().message().find("more than 8 dimensions"), std::string::npos);
}

TEST(ShapeHeaderTest, FitsPlannedNamesWhatDoesNotFit) {
  const TensorMeta planned{{2, 10, 16}, torch::kFloat32};
  EXPECT_TRUE(FitsPlanned(TensorMeta{{1, 3, 16}, torch::kFloat32}, planned, "x").ok());
  EXPECT_TRUE(FitsPlanned(planned, planned, "x").ok());
  absl::Status s = FitsPlanned(TensorMeta{{2, 11, 16}, torch::kFloat32}, planned, "the value");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("the value is Float[2, 11, 16] but Float[2, 10, 16] was planned: "
                             "dimension 1 is larger"),
            std::string::npos)
      << s;
  s = FitsPlanned(TensorMeta{{2, 10}, torch::kFloat32}, planned, "x");
  EXPECT_NE(s.message().find("another number of dimensions"), std::string::npos) << s;
  s = FitsPlanned(TensorMeta{{2, 10, 16}, torch::kBFloat16}, planned, "x");
  EXPECT_NE(s.message().find("another dtype"), std::string::npos) << s;
}

}  // namespace
}  // namespace stagecoach::runtime
