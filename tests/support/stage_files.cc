#include "tests/support/stage_files.h"

#include <torch/serialize.h>

#include <algorithm>
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

std::map<std::string, torch::Tensor> LoadAllStageFiles(const std::string& dir, int64_t step,
                                                       int stages,
                                                       std::vector<StageLayers>* layers) {
  std::map<std::string, torch::Tensor> all;
  if (layers != nullptr) layers->assign(stages, StageLayers{});
  for (int s = 0; s < stages; ++s) {
    for (auto& [name, tensor] : LoadStageFile(StageFilePath(dir, step, s))) {
      EXPECT_EQ(all.count(name), 0u) << name << " is in two stages";
      if (layers != nullptr) {
        (*layers)[s].first = std::min((*layers)[s].first, LayerOf(name));
        (*layers)[s].last = std::max((*layers)[s].last, LayerOf(name));
      }
      all[name] = tensor;
    }
  }
  return all;
}

}  // namespace stagecoach::testing
