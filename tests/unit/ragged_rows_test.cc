// stagectl step's ragged rows (client/ragged_rows.h): a JSON Lines file of documents or of
// inputs/targets objects, or lists of 1-D .npy files, padded to the longest row (inputs with 0,
// targets with -100) with each row's length; every malformed line or file refused naming it.
#include "client/ragged_rows.h"

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/npy.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/process.h"
#include "tests/support/python.h"
#include "tests/support/temp_dir.h"

namespace stagecoach::client::ragged_rows_test {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<int64_t> Values(const v1::TensorData& t) {
  std::vector<int64_t> out(t.data().size() / 8);
  std::memcpy(out.data(), t.data().data(), t.data().size());
  return out;
}

v1::TensorData Int1d(const std::vector<int64_t>& v, const std::string& dtype = "int64") {
  v1::TensorData t;
  t.set_dtype(dtype);
  t.add_shape(static_cast<int64_t>(v.size()));
  std::string bytes;
  for (int64_t x : v) {
    if (dtype == "int64") {
      bytes.append(reinterpret_cast<const char*>(&x), 8);
    } else {
      const int32_t y = static_cast<int32_t>(x);
      bytes.append(reinterpret_cast<const char*>(&y), 4);
    }
  }
  t.set_data(bytes);
  return t;
}

class RaggedRowsTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_.path() + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  std::string Npy(const std::string& name, const v1::TensorData& t) {
    const std::string path = dir_.path() + "/" + name;
    EXPECT_TRUE(WriteNpy(path, t).ok());
    return path;
  }
  std::string Error(const std::string& inputs, const std::string& targets = "",
                    bool forward_only = false) {
    return std::string(ReadRaggedRows(inputs, targets, forward_only).status().message());
  }
  stagecoach::testing::TempDir dir_;
};

TEST_F(RaggedRowsTest, JsonlDocumentsAndObjectsArePaddedWithTheirLengths) {
  const std::string path = Write("rows.jsonl",
                                 "[5, 6, 7, 8]\n"
                                 "\n"
                                 "{\"inputs\": [1], \"targets\": [-100], \"id\": 3}\n"
                                 "[9, 10]\n");
  EXPECT_TRUE(IsRaggedRows(path));
  auto rows = ReadRaggedRows(path, "", /*forward_only=*/false);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_THAT(rows->row_lengths, ElementsAre(3, 1, 1));
  EXPECT_THAT(rows->inputs.shape(), ElementsAre(3, 3));
  EXPECT_EQ(rows->inputs.dtype(), "int64");
  EXPECT_THAT(Values(rows->inputs), ElementsAre(5, 6, 7, 1, 0, 0, 9, 0, 0));
  EXPECT_THAT(Values(rows->targets), ElementsAre(6, 7, 8, -100, -100, -100, 10, -100, -100));
  // Forward only: a document's every id is an input, and no targets.
  auto forward = ReadRaggedRows(path, "", /*forward_only=*/true);
  ASSERT_TRUE(forward.ok()) << forward.status();
  EXPECT_THAT(forward->row_lengths, ElementsAre(4, 1, 2));
  EXPECT_EQ(forward->targets.shape_size(), 0);
}

TEST_F(RaggedRowsTest, NpyListsAreRowsWithTheirTargets) {
  const std::string a = Npy("a.npy", Int1d({3, 4, 5})), b = Npy("b.npy", Int1d({7}, "int32"));
  const std::string ya = Npy("ya.npy", Int1d({4, 5, 6})), yb = Npy("yb.npy", Int1d({8}, "int32"));
  const std::string inputs = absl::StrCat(a, ",", b);
  EXPECT_TRUE(IsRaggedRows(inputs));
  EXPECT_FALSE(IsRaggedRows(a));
  auto rows = ReadRaggedRows(inputs, absl::StrCat(ya, ",", yb), false);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_THAT(rows->row_lengths, ElementsAre(3, 1));
  EXPECT_THAT(Values(rows->inputs), ElementsAre(3, 4, 5, 7, 0, 0));
  EXPECT_THAT(Values(rows->targets), ElementsAre(4, 5, 6, 8, -100, -100));
  EXPECT_THAT(Error(inputs, ya), HasSubstr("--targets: 1 rows for the 2 rows of --inputs"));
  EXPECT_THAT(Error(inputs, absl::StrCat(yb, ",", ya)), HasSubstr("has 1 targets but its row"));
  v1::TensorData matrix = Int1d({1, 2});
  matrix.clear_shape();
  matrix.add_shape(1);
  matrix.add_shape(2);
  EXPECT_THAT(Error(absl::StrCat(a, ",", Npy("m.npy", matrix)), "", true),
              HasSubstr("m.npy is int64 of 2 dimensions; a row of a ragged batch is a 1-D"));
  EXPECT_THAT(Error(absl::StrCat(a, ",", Npy("neg.npy", Int1d({-1}))), "", true),
              HasSubstr("neg.npy: a row needs 1 or more ids, each >= 0"));
}

// Object arrays as numpy saves them (np.save of dtype=object arrays, pickled), made by
// Debian's python3-numpy: arrays of int64 and int32 rows and lists of integers; a pickle that
// calls anything but numpy's array reconstruction is refused naming what it calls.
TEST_F(RaggedRowsTest, NumpyObjectArraysAreRows) {
  if (!stagecoach::testing::PythonCanImport("numpy")) GTEST_SKIP() << "no numpy";
  const std::string script =
      "import numpy as np, datetime, sys\n"
      "d = sys.argv[1]\n"
      "def obj(items):\n"
      "    a = np.empty(len(items), dtype=object)\n"
      "    for i, x in enumerate(items): a[i] = x\n"
      "    return a\n"
      "np.save(d + '/x.npy', obj([np.array([3, 4, 5]), np.array([7], dtype=np.int32), [8, 9]]),"
      " allow_pickle=True)\n"
      "np.save(d + '/y.npy', obj([np.array([4, 5, 6]), np.array([-100]), [9, 10]]),"
      " allow_pickle=True)\n"
      "np.save(d + '/evil.npy', obj([datetime.date(2020, 1, 1)]), allow_pickle=True)\n"
      "np.save(d + '/floats.npy', obj([np.array([1.5])]), allow_pickle=True)\n";
  const stagecoach::testing::CommandResult made = stagecoach::testing::RunCommand(
      {stagecoach::testing::kPython, "-c", script, dir_.path()}, absl::Seconds(60));
  ASSERT_EQ(made.exit_code, 0) << made.err;
  const std::string x = dir_.path() + "/x.npy", y = dir_.path() + "/y.npy";
  EXPECT_TRUE(IsRaggedRows(x));
  auto rows = ReadRaggedRows(x, y, false);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_THAT(rows->row_lengths, ElementsAre(3, 1, 2));
  EXPECT_THAT(Values(rows->inputs), ElementsAre(3, 4, 5, 7, 0, 0, 8, 9, 0));
  EXPECT_THAT(Values(rows->targets), ElementsAre(4, 5, 6, -100, -100, -100, 9, 10, -100));
  // A list of files may mix one-row arrays and object arrays.
  const std::string one = Npy("one.npy", Int1d({1, 2}));
  auto mixed = ReadRaggedRows(absl::StrCat(one, ",", x), "", true);
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  EXPECT_THAT(mixed->row_lengths, ElementsAre(2, 3, 1, 2));
  EXPECT_THAT(Error(dir_.path() + "/evil.npy", "", true),
              HasSubstr("evil.npy: object array: the pickle calls 'datetime date'; only numpy "
                        "arrays of integer arrays are read"));
  EXPECT_THAT(Error(dir_.path() + "/floats.npy", "", true),
              HasSubstr("floats.npy: row 0: not a 1-D little-endian int32 or int64 array "
                        "(dtype f8)"));
  EXPECT_THAT(Error(x, absl::StrCat(y, ",", one)),
              HasSubstr("--targets: 4 rows for the 3 rows of --inputs"));
  // Cut short, the pickle is refused, not read past its end.
  std::ifstream in(x, std::ios::binary);
  const std::string whole((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_THAT(Error(Write("cut.npy", whole.substr(0, whole.size() - 40)), "", true),
              HasSubstr("cut.npy: object array: "));
}

TEST_F(RaggedRowsTest, BadLinesAreRefusedNamingTheFileAndLine) {
  auto error = [&](const std::string& lines) { return Error(Write("bad.jsonl", lines)); };
  EXPECT_THAT(error("[1, 2]\n{oops\n"), HasSubstr("bad.jsonl' line 2: not a JSON array of ids"));
  EXPECT_THAT(error("[1, 2.5]\n"), HasSubstr("line 1[1]: 2.5 is not an id (>= 0)"));
  EXPECT_THAT(error("[7]\n"), HasSubstr("line 1: a document needs 2 or more ids"));
  EXPECT_THAT(error("{\"inputs\": [1, 2]}\n"), HasSubstr("line 1: no \"targets\""));
  EXPECT_THAT(error("{\"inputs\": [1, 2], \"targets\": [3]}\n"),
              HasSubstr("line 1: 2 inputs but 1 targets"));
  EXPECT_THAT(error("{\"inputs\": [1], \"targets\": [-5]}\n"),
              HasSubstr("line 1: targets[0]: -5 is not an id or -100"));
  EXPECT_THAT(error("\n\n"), HasSubstr("holds no row"));
  EXPECT_THAT(Error(Write("x.jsonl", "[1, 2]\n"), "y.npy"),
              HasSubstr("--targets: not used with a .jsonl --inputs"));
  EXPECT_THAT(Error(dir_.path() + "/none.jsonl"), HasSubstr("--inputs: cannot open '"));
}

}  // namespace
}  // namespace stagecoach::client::ragged_rows_test
