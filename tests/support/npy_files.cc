#include "tests/support/npy_files.h"

#include <torch/torch.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace stagecoach::testing {

void WriteNpy(const std::string& path, const torch::Tensor& t, const std::string& descr) {
  const torch::Tensor c = (descr == "<f4" ? t.to(torch::kFloat32) : t).contiguous();
  std::vector<std::string> dims;
  for (int64_t d : c.sizes()) dims.push_back(std::to_string(d));
  std::string header =
      absl::StrCat("{'descr': '", descr, "', 'fortran_order': False, 'shape': (",
                   absl::StrJoin(dims, ", "), dims.size() == 1 ? ",)" : ")", ", }");
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  out << "\x93NUMPY" << '\x01' << '\x00' << static_cast<char>(header.size() & 0xff)
      << static_cast<char>(header.size() >> 8) << header;
  out.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
}

torch::Tensor ReadNpy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() < 10 || bytes.substr(0, 6) != "\x93NUMPY") {
    ADD_FAILURE() << path << " is not a .npy file";
    return {};
  }
  const size_t length = static_cast<unsigned char>(bytes[8]) |
                        (static_cast<size_t>(static_cast<unsigned char>(bytes[9])) << 8);
  const std::string header = bytes.substr(10, length);
  EXPECT_NE(header.find("'descr': '<f4'"), std::string::npos) << path << ": " << header;
  EXPECT_NE(header.find("'fortran_order': False"), std::string::npos) << path << ": " << header;
  const size_t open = header.find("'shape': (") + 10;
  std::vector<int64_t> shape;
  for (absl::string_view d : absl::StrSplit(header.substr(open, header.find(')', open) - open), ',',
                                            absl::SkipWhitespace())) {
    int64_t v = 0;
    EXPECT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(d), &v)) << path << ": " << header;
    shape.push_back(v);
  }
  torch::Tensor t = torch::empty(shape, torch::kFloat32);
  if (bytes.size() - 10 - length != t.nbytes()) {
    ADD_FAILURE() << path << ": " << bytes.size() - 10 - length << " data bytes for shape "
                  << t.sizes();
    return {};
  }
  std::memcpy(t.data_ptr(), bytes.data() + 10 + length, t.nbytes());
  return t;
}

}  // namespace stagecoach::testing
