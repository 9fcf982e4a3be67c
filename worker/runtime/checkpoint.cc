#include "worker/runtime/checkpoint.h"

#include <torch/serialize.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace stagecoach::runtime {

std::string StageParametersPath(const std::string& dir, int64_t steps, int stage) {
  return absl::StrFormat("%s/step-%06d/stage-%d.pt", dir, steps, stage);
}

absl::Status WriteStageParameters(
    const std::string& dir, int64_t steps, int stage,
    const std::vector<std::pair<std::string, torch::Tensor>>& params) {
  const std::string path = StageParametersPath(dir, steps, stage);
  const std::string tmp = absl::StrCat(path, ".tmp-", getpid());
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("training.checkpoint.dir: cannot create ",
                     std::filesystem::path(path).parent_path().string(), ": ", ec.message()));
  }
  try {
    c10::Dict<std::string, torch::Tensor> dict;
    for (const auto& [name, t] : params) dict.insert(name, t.detach().to(torch::kCPU).clone());
    const std::vector<char> bytes = torch::pickle_save(c10::IValue(dict));
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) return absl::DataLossError(absl::StrCat("writing ", tmp, " failed"));
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("saving stage ", stage, " parameters: ", e.what_without_backtrace()));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::DataLossError(absl::StrCat("renaming ", tmp, " to ", path, " failed"));
  }
  return absl::OkStatus();
}

}  // namespace stagecoach::runtime
