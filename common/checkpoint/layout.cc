// The checkpoint layout (see layout.h).
#include "common/checkpoint/layout.h"

#include <cstdio>
#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace stagecoach::checkpoint {
namespace {

constexpr absl::string_view kStepPrefix = "step-";

}  // namespace

std::string StepDirectoryName(int64_t step) { return absl::StrFormat("step-%06d", step); }

std::string CheckpointStepDirectory(const std::string& dir, int64_t step) {
  return (std::filesystem::path(dir) / StepDirectoryName(step)).string();
}

std::optional<int64_t> StepOfCheckpointDirectory(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, kStepPrefix) || name.empty()) return std::nullopt;
  for (char c : name) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return std::nullopt;
  }
  int64_t step = 0;
  if (!absl::SimpleAtoi(name, &step)) return std::nullopt;  // out of range
  // Only the canonical spelling: "step-000040", not "step-40" or "step-0000040".
  if (absl::StrFormat("%06d", step) != name) return std::nullopt;
  return step;
}

std::string ManifestPath(const std::string& step_dir) {
  return (std::filesystem::path(step_dir) / kManifestFileName).string();
}

std::string StageStateFileName(int stage) { return absl::StrCat("stage-", stage, ".pt"); }

std::string StageExportFileName(int stage) {
  return absl::StrCat("stage-", stage, ".state_dict.pt");
}

std::string OptimizerShardFileName(int stage, int replica, int replicas) {
  return absl::StrCat("stage-", stage, ".optimizer-", replica, "-of-", replicas, ".pt");
}

std::optional<OptimizerShardName> ParseOptimizerShardFileName(absl::string_view name) {
  OptimizerShardName out;
  char tail = 0;
  const std::string text(name);
  if (std::sscanf(text.c_str(), "stage-%d.optimizer-%d-of-%d.p%c", &out.stage, &out.replica,
                  &out.replicas, &tail) != 4 ||
      text != OptimizerShardFileName(out.stage, out.replica, out.replicas) || out.stage < 0 ||
      out.replicas < 1 || out.replica < 0 || out.replica >= out.replicas) {
    return std::nullopt;
  }
  return out;
}

std::string HfShardFileName(int stage, int part) {
  return absl::StrFormat("%s/stage-%d-%05d.safetensors", kHfDirName, stage, part);
}

bool IsCheckpointFileName(absl::string_view name) {
  absl::ConsumePrefix(&name, absl::StrCat(kHfDirName, "/"));
  return !name.empty() && name != "." && name != ".." &&
         name.find('/') == absl::string_view::npos && name != kManifestFileName;
}

}  // namespace stagecoach::checkpoint
