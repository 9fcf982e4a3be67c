#include "worker/runtime/training/resume_by_name.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"
#include "worker/runtime/checkpoint/checkpoint.h"
#include "worker/runtime/checkpoint/checkpoint_by_name.h"

namespace stagecoach::runtime {

absl::Status RestoreStagesByName(const v1::ResumeTask& resume, const StateFiles& files,
                                 const std::map<int, model::StageModel*>& stages,
                                 const std::optional<TiedPair>& tied,
                                 torch::optim::Optimizer* optimizer, ZeroShards* shards) {
  ASSIGN_OR_RETURN(const CheckpointByName saved, CheckpointByName::Read(resume, files));
  std::map<std::string, std::string> aliases;
  if (tied.has_value()) aliases[tied->second_name] = tied->first_name;
  for (const auto& [s, stage] : stages) {
    const std::vector<std::pair<std::string, torch::Tensor>> params = stage->NamedParameters();
    const std::vector<std::pair<std::string, torch::Tensor>> buffers = stage->NamedBuffers();
    ASSIGN_OR_RETURN(SavedState state, saved.StateFor(s, params, buffers, aliases));
    const std::string where = absl::StrCat("stage ", s, " restored by name from ", files.name());
    if (shards == nullptr) {
      RETURN_IF_ERROR(RestoreSavedState(std::move(state), where, params, optimizer, buffers));
      continue;
    }
    RETURN_IF_ERROR(RestoreSavedState(state, where, params, nullptr, buffers));
    if (optimizer != nullptr) {
      RETURN_IF_ERROR(InstallShardState(state, s, params, *optimizer, *shards, where));
    }
  }
  if (shards != nullptr) shards->LoadShards();
  return absl::OkStatus();
}

}  // namespace stagecoach::runtime
