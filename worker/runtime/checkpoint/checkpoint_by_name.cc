#include "worker/runtime/checkpoint/checkpoint_by_name.h"

#include <torch/torch.h>

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checkpoint/layout.h"
#include "common/util/status_macros.h"

namespace stagecoach::runtime {
namespace {

// Every optimizer-state field a checkpoint may hold (checkpoint.h's layout).
const std::vector<std::string>& KnownFields() {
  static const std::vector<std::string> fields = {"momentum_buffer", "exp_avg", "exp_avg_sq",
                                                  "max_exp_avg_sq", "step"};
  return fields;
}

// "<param>.<field>" split for a parameter among `params`; nullopt when the key is not one.
std::optional<std::pair<std::string, std::string>> SplitStateKey(
    const std::string& key, const std::map<std::string, torch::Tensor>& params) {
  for (const std::string& field : KnownFields()) {
    if (key.size() <= field.size() + 1) continue;
    const size_t dot = key.size() - field.size() - 1;
    if (key[dot] != '.' || key.compare(dot + 1, std::string::npos, field) != 0) continue;
    std::string name = key.substr(0, dot);
    if (params.count(name) != 0) return std::make_pair(std::move(name), field);
  }
  return std::nullopt;
}

}  // namespace

std::string CheckpointByName::Where() const {
  return absl::StrCat("checkpoint ", dir_, " (its stages ", absl::StrJoin(stages_, ", "), ")");
}

absl::Status CheckpointByName::AddStageFile(const SavedState& file, const std::string& name) {
  for (const auto& [param, value] : file.params) {
    auto [it, added] = params_.emplace(param, value);
    if (!added && it->second.sizes() != value.sizes()) {
      return absl::DataLossError(absl::StrCat("checkpoint ", dir_, ": parameter '", param, "' is ",
                                              DescribeTensor(it->second), " in one stage and ",
                                              DescribeTensor(value), " in ", name));
    }
  }
  for (const auto& [key, value] : file.optimizer) {
    auto split = SplitStateKey(key, file.params);
    if (!split.has_value()) {
      return absl::DataLossError(absl::StrCat("checkpoint ", dir_, " ", name, ": optimizer state '",
                                              key, "' belongs to no parameter of the file"));
    }
    optimizer_[split->first][split->second] = value;
  }
  if (file.buffers.has_value()) {
    for (const auto& [buffer, value] : *file.buffers) buffers_.emplace(buffer, value);
  } else {
    some_without_buffers_ = true;
  }
  return absl::OkStatus();
}

absl::Status CheckpointByName::AddShards(int stage, const std::vector<SavedState>& shards,
                                         const std::string& first_file) {
  const SavedState& first = shards.front();
  const std::string where = absl::StrCat("checkpoint ", dir_, " ", first_file);
  if (first.shard_layout.empty()) {
    return absl::DataLossError(
        absl::StrCat(where,
                     " keeps no shard layout (written before layouts were kept): resume it on the "
                     "stages it was written with"));
  }
  int64_t numel = 0;
  for (const auto& [name, sizes] : first.shard_layout) {
    int64_t n = 1;
    for (int64_t d : sizes) n *= d;
    numel += n;
  }
  const int64_t c = first.params.count("shard") != 0 ? first.params.at("shard").numel() : -1;
  if (c < 0 || c * static_cast<int64_t>(shards.size()) < numel) {
    return absl::DataLossError(absl::StrCat(where, ": its layout holds ", numel,
                                            " elements, more than its ", shards.size(),
                                            " shards of ", c));
  }
  // Each field: the replicas' shards in order, cut back to the stage's elements.
  StateFields flat;
  for (const std::string& field : KnownFields()) {
    const std::string key = absl::StrCat("shard.", field);
    if (first.optimizer.count(key) == 0) continue;
    if (field == "step") {
      flat[field] = first.optimizer.at(key);
      continue;
    }
    std::vector<torch::Tensor> parts;
    for (const SavedState& shard : shards) {
      auto it = shard.optimizer.find(key);
      if (it == shard.optimizer.end() || it->second.numel() != c) {
        return absl::DataLossError(absl::StrCat("checkpoint ", dir_, " stage ", stage,
                                                ": optimizer state '", field,
                                                "' is missing or misshapen in a shard"));
      }
      parts.push_back(it->second.reshape(-1));
    }
    flat[field] = torch::cat(parts).narrow(0, 0, numel);
  }
  int64_t offset = 0;
  for (const auto& [name, sizes] : first.shard_layout) {
    int64_t n = 1;
    for (int64_t d : sizes) n *= d;
    StateFields& fields = optimizer_[name];
    for (const auto& [field, value] : flat) {
      fields[field] = field == "step" ? value : value.narrow(0, offset, n).reshape(sizes).clone();
    }
    offset += n;
  }
  return absl::OkStatus();
}

absl::StatusOr<CheckpointByName> CheckpointByName::Read(const v1::ResumeTask& resume) {
  return Read(resume, StateFiles(resume.directory()));
}

absl::StatusOr<CheckpointByName> CheckpointByName::Read(const v1::ResumeTask& resume,
                                                        const StateFiles& files) {
  CheckpointByName out;
  out.dir_ = files.name();
  out.step_ = resume.step();
  // Shard files by stage, then replica.
  std::map<int, std::map<int, std::pair<int, v1::StageCheckpointFile>>> shard_files;
  for (const v1::StageCheckpointFile& f : resume.files()) {
    if (f.file() == checkpoint::StageStateFileName(f.stage())) {
      ASSIGN_OR_RETURN(SavedState saved, ReadStateFile(files, f, f.stage()));
      out.stages_.insert(f.stage());
      RETURN_IF_ERROR(out.AddStageFile(saved, f.file()));
    } else if (auto name = checkpoint::ParseOptimizerShardFileName(f.file());
               name.has_value() && name->stage == f.stage()) {
      shard_files[f.stage()][name->replica] = {name->replicas, f};
    }
  }
  for (const auto& [stage, by_replica] : shard_files) {
    // The largest set any file names, so that a file of a smaller set is "of another set".
    int d = 0;
    for (const auto& [k, file] : by_replica) d = std::max(d, file.first);
    std::vector<SavedState> shards;
    for (int k = 0; k < d; ++k) {
      auto it = by_replica.find(k);
      if (it == by_replica.end() || it->second.first != d) {
        return absl::DataLossError(
            absl::StrCat("checkpoint ", out.dir_, " stage ", stage,
                         ": its optimizer shard files do not make "
                         "one set of ",
                         d, " (", checkpoint::OptimizerShardFileName(stage, k, d),
                         it == by_replica.end() ? " is missing)" : " is of another set)"));
      }
      ASSIGN_OR_RETURN(SavedState shard, ReadStateFile(files, it->second.second, stage));
      shards.push_back(std::move(shard));
    }
    RETURN_IF_ERROR(out.AddShards(stage, shards, checkpoint::OptimizerShardFileName(stage, 0, d)));
  }
  return out;
}

absl::StatusOr<SavedState> CheckpointByName::StateFor(
    int stage, const std::vector<std::pair<std::string, torch::Tensor>>& params,
    const std::vector<std::pair<std::string, torch::Tensor>>& buffers,
    const std::map<std::string, std::string>& aliases) const {
  SavedState out;
  out.stage = stage;
  out.step = step_;
  out.data_position = step_;
  auto source = [&](const std::string& name, const auto& held) -> const std::string* {
    if (held.count(name) != 0) return &name;
    auto alias = aliases.find(name);
    if (alias != aliases.end() && held.count(alias->second) != 0) return &alias->second;
    return nullptr;
  };
  for (const auto& [name, p] : params) {
    const std::string* from = source(name, params_);
    if (from == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("stage ", stage, ": parameter '", name, "' is in none of ", Where()));
    }
    out.params[name] = params_.at(*from);
    out.param_order.push_back(name);
    const std::string* state_from = source(name, optimizer_);
    if (state_from == nullptr) continue;
    for (const auto& [field, value] : optimizer_.at(*state_from)) {
      out.optimizer[absl::StrCat(name, ".", field)] = value;
    }
  }
  if (buffers.empty()) return out;
  out.buffers.emplace();
  for (const auto& [name, b] : buffers) {
    auto it = buffers_.find(name);
    if (it == buffers_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stage ", stage, ": buffer '", name, "' is in none of ", Where(),
          some_without_buffers_ ? " (some of its files were written before buffers were kept)"
                                : ""));
    }
    (*out.buffers)[name] = it->second;
  }
  return out;
}

}  // namespace stagecoach::runtime
