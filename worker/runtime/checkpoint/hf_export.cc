#include "worker/runtime/checkpoint/hf_export.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/checkpoint/layout.h"
#include "common/hf/decoder_tensors.h"
#include "common/safetensors/model_dir.h"
#include "common/safetensors/writer.h"
#include "common/util/sha256.h"
#include "common/util/status_macros.h"
#include "worker/model/hf_tensors.h"

namespace stagecoach::runtime {

absl::StatusOr<std::vector<v1::StageCheckpointFile>> WriteHfExport(
    const std::string& step_dir, int stage,
    const std::vector<std::pair<std::string, torch::Tensor>>& params, const std::string& omitted,
    uint64_t max_part_bytes) {
  std::vector<safetensors::TensorToWrite> tensors;
  std::vector<torch::Tensor> holders;
  std::vector<uint64_t> bytes;
  tensors.reserve(params.size());
  holders.reserve(params.size());
  for (const auto& [name, p] : params) {
    if (name == omitted) continue;
    const std::optional<std::string> hf_name = hf::HfName(name);
    if (!hf_name.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("stage ", stage, ": parameter ", name, " has no Hugging Face name"));
    }
    torch::Tensor& holder = holders.emplace_back();
    ASSIGN_OR_RETURN(safetensors::TensorToWrite t, model::ParameterToWrite(*hf_name, p, &holder));
    bytes.push_back(t.data.size());
    tensors.push_back(std::move(t));
  }
  std::vector<v1::StageCheckpointFile> out;
  if (tensors.empty()) return out;
  std::error_code ec;
  const std::string dir = absl::StrCat(step_dir, "/", checkpoint::kHfDirName);
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::PermissionDeniedError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  }
  const std::vector<std::vector<size_t>> parts = safetensors::PlanShards(bytes, max_part_bytes);
  for (size_t k = 0; k < parts.size(); ++k) {
    std::vector<safetensors::TensorToWrite> part;
    for (size_t i : parts[k]) part.push_back(tensors[i]);
    const std::string file = checkpoint::HfShardFileName(stage, static_cast<int>(k) + 1);
    const std::string path = absl::StrCat(step_dir, "/", file);
    RETURN_IF_ERROR(safetensors::WriteSafetensors(path, part, {{"format", "pt"}}));
    ASSIGN_OR_RETURN(std::string sha, Sha256OfFile(path));
    v1::StageCheckpointFile& entry = out.emplace_back();
    entry.set_stage(stage);
    entry.set_file(file);
    entry.set_size_bytes(static_cast<int64_t>(std::filesystem::file_size(path)));
    entry.set_sha256(std::move(sha));
  }
  return out;
}

}  // namespace stagecoach::runtime
