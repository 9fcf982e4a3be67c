// stagectl's .npy reader and writer: numpy's own layout, every supported dtype, and a clear
// error naming the file for everything it refuses.
#include "client/npy.h"

#include <cstring>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagecoach::client::npy_test {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

template <typename T>
std::string Bytes(std::initializer_list<T> values) {
  std::string out(values.size() * sizeof(T), '\0');
  std::memcpy(out.data(), values.begin(), out.size());
  return out;
}

// An .npy file as numpy 1.x writes it: version 1.0, the header padded with spaces and a
// newline so that the data starts at a multiple of 64 bytes.
std::string NumpyFile(const std::string& dict, const std::string& data, char major = 1) {
  std::string header = dict;
  const size_t prefix = major == 1 ? 10 : 12;
  while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY";
  out += major;
  out += '\0';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  if (major != 1) out += std::string(2, '\0');
  return out + header + data;
}

v1::TensorData Tensor(const std::string& dtype, std::vector<int64_t> shape, std::string data) {
  v1::TensorData t;
  t.set_dtype(dtype);
  for (int64_t d : shape) t.add_shape(d);
  t.set_data(std::move(data));
  return t;
}

TEST(NpyTest, ReadsWhatNumpyWrites) {
  const std::string data = Bytes<float>({1, 2, 3, 4, 5, 6});
  auto t = ParseNpy(NumpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", data),
                    "x.npy");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->dtype(), "float32");
  EXPECT_THAT(t->shape(), ElementsAre(2, 3));
  EXPECT_EQ(t->data(), data);
}

TEST(NpyTest, WritesNumpysLayoutByteForByte) {
  const std::string data = Bytes<float>({1, 2, 3, 4, 5, 6});
  auto bytes = SerializeNpy(Tensor("float32", {2, 3}, data));
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, NumpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", data));
  EXPECT_EQ(bytes->size(), 128 + data.size());
}

TEST(NpyTest, RoundTripsEveryDtypeAndRank) {
  const std::vector<v1::TensorData> cases = {
      Tensor("float32", {3}, Bytes<float>({1.5f, -2, 3})),
      Tensor("float64", {2, 2}, Bytes<double>({1e-300, -0.0, 3.25, 4})),
      Tensor("int64", {1, 2, 2}, Bytes<int64_t>({-1, 1LL << 40, 3, 4})),
      Tensor("int32", {4, 1}, Bytes<int32_t>({7, -8, 9, 10})),
      Tensor("float32", {}, Bytes<float>({42})),  // a scalar
      Tensor("float32", {0, 16}, ""),             // no rows
  };
  for (const v1::TensorData& want : cases) {
    auto bytes = SerializeNpy(want);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    auto got = ParseNpy(*bytes, "t.npy");
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->dtype(), want.dtype());
    EXPECT_THAT(got->shape(), ::testing::ElementsAreArray(want.shape()));
    EXPECT_EQ(got->data(), want.data());
  }
}

TEST(NpyTest, AcceptsVersion2DoubleQuotesPython2LongsAndNoTrailingComma) {
  const std::string data = Bytes<int64_t>({1, 2});
  auto t = ParseNpy(
      NumpyFile("{\"descr\": \"<i8\", \"shape\": (2L,), \"fortran_order\": False}", data, 2),
      "x.npy");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->dtype(), "int64");
  EXPECT_THAT(t->shape(), ElementsAre(2));
}

TEST(NpyTest, FortranOrderIsFineWhereTheLayoutIsTheSame) {
  auto t = ParseNpy(
      NumpyFile("{'descr': '<i4', 'fortran_order': True, 'shape': (2,), }", Bytes<int32_t>({1, 2})),
      "x.npy");
  EXPECT_TRUE(t.ok()) << t.status();
}

TEST(NpyTest, WritesAndReadsFiles) {
  const std::string path =
      (std::filesystem::temp_directory_path() / absl::StrCat("npy_test_", getpid(), ".npy"))
          .string();
  const v1::TensorData want = Tensor("float64", {2}, Bytes<double>({0.5, 0.25}));
  ASSERT_TRUE(WriteNpy(path, want).ok());
  auto got = ReadNpy(path);
  std::filesystem::remove(path);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->data(), want.data());
  auto missing = ReadNpy(path);
  EXPECT_TRUE(absl::IsNotFound(missing.status()));
  EXPECT_THAT(missing.status().message(), HasSubstr(path));
}

// Every refusal is INVALID_ARGUMENT and starts with the file's name.
void ExpectRefused(const std::string& bytes, const std::string& why) {
  auto t = ParseNpy(bytes, "in.npy");
  ASSERT_FALSE(t.ok()) << "accepted, expected: " << why;
  EXPECT_TRUE(absl::IsInvalidArgument(t.status())) << t.status();
  const std::string message(t.status().message());
  EXPECT_THAT(message, ::testing::StartsWith("in.npy: "));
  EXPECT_THAT(message, HasSubstr(why));
}

TEST(NpyTest, RefusesWhatItCannotReadNamingTheFileAndWhy) {
  const std::string f4 = Bytes<float>({1, 2, 3, 4});
  ExpectRefused("PK\x03\x04 a zip file", "not a NumPy .npy file");
  ExpectRefused("", "not a NumPy .npy file");
  ExpectRefused(NumpyFile("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 2), }", f4),
                "big-endian");
  ExpectRefused(NumpyFile("{'descr': '<f2', 'fortran_order': False, 'shape': (2, 2), }", f4),
                "dtype '<f2' is not supported");
  ExpectRefused(NumpyFile("{'descr': '|u1', 'fortran_order': False, 'shape': (16,), }", f4),
                "dtype '|u1' is not supported");
  ExpectRefused(NumpyFile("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (4,), }", f4),
                "structured dtypes are not supported");
  ExpectRefused(NumpyFile("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", f4),
                "Fortran-order arrays are not supported");
  ExpectRefused(
      NumpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }", f4),
      "truncated data: <f4 shape (3, 2) needs 24 bytes after the header, the file has 16");
  ExpectRefused(NumpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", f4),
                "extra data");
  ExpectRefused(
      NumpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", f4).substr(0, 40),
      "truncated header");
  ExpectRefused(NumpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (2, -2), }", f4),
                "malformed header");
  ExpectRefused(NumpyFile("{'descr': '<f4', 'shape': (4,), }", f4), "'fortran_order'");
  std::string v4 = NumpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", f4);
  v4[6] = 4;
  ExpectRefused(v4, "version 4.0 is not supported");
}

TEST(NpyTest, RefusesToWriteAMalformedTensor) {
  EXPECT_FALSE(SerializeNpy(Tensor("float32", {3}, Bytes<float>({1, 2}))).ok());
  EXPECT_FALSE(SerializeNpy(Tensor("bfloat16", {1}, "ab")).ok());
}

}  // namespace
}  // namespace stagecoach::client::npy_test
