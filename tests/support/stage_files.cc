#include "tests/support/stage_files.h"

#include <torch/serialize.h>

#include <fstream>
#include <iterator>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"

namespace stagecoach::testing {

std::string StageFilePath(const std::string& dir, int64_t step, int stage) {
  return absl::StrFormat("%s/step-%06d/stage-%d.state_dict.pt", dir, step, stage);
}

std::map<std::string, torch::Tensor> LoadStageFile(const std::string& path) {
  std::map<std::string, torch::Tensor> out;
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "missing " << path;
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.empty()) return out;
  for (const auto& entry : torch::pickle_load(bytes).toGenericDict()) {
    out[entry.key().toStringRef()] = entry.value().toTensor();
  }
  return out;
}

int LayerOf(const std::string& name) { return std::stoi(name.substr(0, name.find('.'))); }

}  // namespace stagecoach::testing
