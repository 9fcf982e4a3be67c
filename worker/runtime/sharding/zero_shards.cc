#include "worker/runtime/sharding/zero_shards.h"

#include <torch/torch.h>

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"
#include "worker/runtime/checkpoint/checkpoint.h"
#include "worker/runtime/checkpoint/optimizer_state.h"
#include "worker/runtime/executor/training_setup.h"

namespace stagecoach::runtime {
namespace {

// The stage's parameters flattened in order and padded with zeros to `padded` elements.
torch::Tensor Flatten(const std::vector<torch::Tensor>& tensors, int64_t padded,
                      const torch::TensorOptions& options) {
  torch::Tensor flat = torch::zeros({padded}, options);
  int64_t offset = 0;
  for (const torch::Tensor& t : tensors) {
    if (t.defined()) flat.narrow(0, offset, t.numel()).copy_(t.detach().reshape(-1));
    offset += t.numel();
  }
  return flat;
}

int64_t ShardNumel(int64_t numel, int replicas) { return (numel + replicas - 1) / replicas; }

// The flat state fields of `params` in `optimizer`: each field's per-parameter tensors
// concatenated in order (zeros where a parameter has none), "step" from the first that has it.
absl::StatusOr<StateFields> FlatFields(const torch::optim::Optimizer& optimizer,
                                       const std::vector<torch::Tensor>& params, int64_t numel) {
  std::vector<StateFields> per_param;
  StateFields out;
  for (const torch::Tensor& p : params) {
    ASSIGN_OR_RETURN(StateFields f, ParamStateFields(optimizer, p));
    for (const auto& [name, value] : f) {
      if (name == "step") {
        if (out.count("step") == 0) out["step"] = value;
      } else if (out.count(name) == 0) {
        out[name] = torch::Tensor();
      }
    }
    per_param.push_back(std::move(f));
  }
  for (auto& [name, flat] : out) {
    if (name == "step") continue;
    std::vector<torch::Tensor> parts;
    for (size_t i = 0; i < params.size(); ++i) {
      auto it = per_param[i].find(name);
      parts.push_back(it != per_param[i].end() ? it->second : torch::zeros_like(params[i]));
    }
    flat = Flatten(parts, numel, params.front().options().device(torch::kCPU));
  }
  return out;
}

struct ShardFile {
  int replica = 0;
  int replicas = 0;
  v1::StageCheckpointFile file;
};

// The stage's optimizer shard files among the checkpoint's, by replica; empty when it has none.
absl::StatusOr<std::vector<ShardFile>> ShardFilesOf(const v1::ResumeTask& resume, int stage) {
  std::vector<ShardFile> found;
  for (const v1::StageCheckpointFile& f : resume.files()) {
    const std::optional<checkpoint::OptimizerShardName> name =
        checkpoint::ParseOptimizerShardFileName(f.file());
    if (f.stage() != stage || !name.has_value() || name->stage != stage) continue;
    found.push_back(ShardFile{name->replica, name->replicas, f});
  }
  if (found.empty()) return found;
  const int d = found.front().replicas;
  std::vector<ShardFile> by_replica(d);
  for (const ShardFile& f : found) {
    if (f.replicas != d || f.replica < 0 || f.replica >= d || by_replica[f.replica].replicas != 0) {
      return absl::DataLossError(absl::StrCat("checkpoint ", resume.directory(), " stage ", stage,
                                              ": its optimizer shard files do not make one set (",
                                              f.file.file(), ")"));
    }
    by_replica[f.replica] = f;
  }
  for (int k = 0; k < d; ++k) {
    if (by_replica[k].replicas == 0) {
      return absl::DataLossError(absl::StrCat("checkpoint ", resume.directory(), " stage ", stage,
                                              ": ", OptimizerShardFileName(stage, k, d),
                                              " is missing"));
    }
  }
  return by_replica;
}

// The stage's flat optimizer state (fields of `numel` elements) from its shard files.
absl::StatusOr<StateFields> FlatFromShards(const v1::ResumeTask& resume, int stage,
                                           const std::vector<ShardFile>& files, int64_t numel,
                                           const torch::TensorOptions& options,
                                           const spec::OptimizerSpec& spec) {
  const int d = files.front().replicas;
  const int64_t c = ShardNumel(numel, d);
  std::map<std::string, std::vector<torch::Tensor>> parts;
  StateFields out;
  for (const ShardFile& f : files) {
    torch::Tensor shard = torch::zeros({c}, options.device(torch::kCPU)).requires_grad_(true);
    ASSIGN_OR_RETURN(std::unique_ptr<torch::optim::Optimizer> reader, MakeOptimizer(spec, {shard}));
    RETURN_IF_ERROR(
        RestoreStageCheckpoint(resume.directory(), f.file, stage, {{"shard", shard}}, *reader));
    ASSIGN_OR_RETURN(StateFields fields, ParamStateFields(*reader, shard));
    for (auto& [name, value] : fields) {
      if (name == "step") {
        out.emplace("step", value);
      } else {
        parts[name].push_back(value.reshape(-1));
      }
    }
  }
  for (auto& [name, list] : parts) {
    if (static_cast<int>(list.size()) != d) {
      return absl::DataLossError(absl::StrCat("checkpoint ", resume.directory(), " stage ", stage,
                                              ": optimizer state '", name, "' is in ", list.size(),
                                              " of its ", d, " shards"));
    }
    out[name] = torch::cat(list).narrow(0, 0, numel);
  }
  return out;
}

// Installs the stage's flat optimizer state (each field over the stage's parameters in order,
// "step" an integer) into this replica's shard of `shards`: each field padded to the replicas'
// shards and this replica's part cut out. INVALID_ARGUMENT naming `where` when a field holds more
// elements than the shards. LibTorch errors propagate as c10::Error.
absl::Status InstallFlatInShard(const StateFields& flat, int stage,
                                torch::optim::Optimizer& optimizer, const ZeroShards& shards,
                                const std::string& where) {
  const torch::Tensor& shard = shards.shard(stage);
  const int64_t c = shard.numel();
  StateFields mine;
  for (const auto& [field, value] : flat) {
    if (field == "step") {
      mine[field] = value;
      continue;
    }
    torch::Tensor padded = torch::zeros({c * shards.replicas()}, value.options());
    if (value.numel() > padded.numel()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": optimizer state '", field, "' has ", value.numel(),
                       " elements, the stage's shards ", padded.numel()));
    }
    padded.narrow(0, 0, value.numel()).copy_(value.reshape(-1));
    mine[field] = padded.narrow(0, shards.replica() * c, c);
  }
  if (mine.empty()) return absl::OkStatus();
  return SetParamStateFields(optimizer, shard, mine, where);
}

}  // namespace

ShardLayout ZeroShards::LayoutOf(const Layout& layout) {
  ShardLayout out;
  for (size_t i = 0; i < layout.params.size(); ++i)
    out.emplace_back(layout.names[i], layout.shapes[i]);
  return out;
}

absl::StatusOr<std::unique_ptr<ZeroShards>> ZeroShards::Create(
    const std::map<int, model::StageModel*>& stages, int replica, int replicas,
    spec::ShardLevel level) {
  std::unique_ptr<ZeroShards> out(new ZeroShards(replica, replicas, level));
  for (const auto& [s, stage] : stages) {
    Layout& layout = out->layouts_[s];
    for (auto& [name, p] : stage->NamedParameters()) {
      if (!p.is_floating_point() ||
          (!layout.params.empty() && p.scalar_type() != layout.params.front().scalar_type())) {
        return absl::InvalidArgumentError(
            absl::StrCat("placement.shard: ", spec::ShardLevelName(level), ": stage ", s,
                         " parameter '", name, "' is not of the stage's one floating dtype"));
      }
      layout.params.push_back(p);
      layout.names.push_back(name);
      layout.shapes.push_back(p.sizes().vec());
      layout.numel += p.numel();
    }
    if (layout.params.empty()) continue;
    layout.shard = torch::zeros({ShardNumel(layout.numel, replicas)},
                                layout.params.front().options().requires_grad(false));
    layout.shard.set_requires_grad(true);
  }
  out->LoadShards();
  return out;
}

std::vector<int> ZeroShards::stages() const {
  std::vector<int> out;
  for (const auto& [s, layout] : layouts_) {
    if (layout.shard.defined()) out.push_back(s);
  }
  return out;
}

std::vector<torch::Tensor> ZeroShards::ShardParameters() const {
  std::vector<torch::Tensor> out;
  for (const auto& [s, layout] : layouts_) {
    if (layout.shard.defined()) out.push_back(layout.shard);
  }
  return out;
}

void ZeroShards::LoadShards() {
  torch::NoGradGuard no_grad;
  for (auto& [s, layout] : layouts_) {
    if (!layout.shard.defined()) continue;
    const int64_t c = layout.shard.numel();
    torch::Tensor flat = Flatten(layout.params, c * replicas_, layout.shard.options());
    layout.shard.copy_(flat.narrow(0, replica_ * c, c));
  }
}

void ZeroShards::ClearStageGradients() {
  for (auto& [s, layout] : layouts_) {
    for (torch::Tensor& p : layout.params) {
      p.mutable_grad() = torch::Tensor();
    }
  }
}

torch::Tensor ZeroShards::FlatGradients(int stage, torch::Device device) {
  Layout& layout = layouts_.at(stage);
  const bool free_as_copied = level_ >= spec::ShardLevel::kGradients;
  torch::Tensor flat =
      torch::zeros({layout.shard.numel() * replicas_}, layout.shard.options().device(device));
  int64_t offset = 0;
  for (size_t i = 0; i < layout.params.size(); ++i) {
    torch::Tensor& p = layout.params[i];
    const int64_t n = c10::multiply_integers(layout.shapes[i]);
    if (p.grad().defined()) flat.narrow(0, offset, n).copy_(p.grad().detach().reshape(-1));
    if (free_as_copied) p.mutable_grad() = torch::Tensor();
    offset += n;
  }
  return flat;
}

void ZeroShards::SetShardGradient(int stage, const torch::Tensor& grad) {
  torch::Tensor& shard = layouts_.at(stage).shard;
  shard.mutable_grad() = grad.to(shard.options().requires_grad(false));
  if (level_ < spec::ShardLevel::kGradients) return;
  for (torch::Tensor& p : layouts_.at(stage).params) p.mutable_grad() = torch::Tensor();
}

absl::StatusOr<torch::Tensor> ZeroShards::AllGatherShards(int stage,
                                                          collectives::Collectives& group,
                                                          absl::Duration timeout) {
  torch::NoGradGuard no_grad;
  const Layout& layout = layouts_.at(stage);
  const int64_t c = layout.shard.numel();
  const torch::Device device =
      group.takes_device_memory() ? layout.shard.device() : torch::Device(torch::kCPU);
  torch::Tensor mine = layout.shard.detach().to(device).contiguous();
  torch::Tensor all = torch::empty({c * replicas_}, mine.options());
  const collectives::DataType dtype = mine.scalar_type() == torch::kFloat64
                                          ? collectives::DataType::kFloat64
                                          : collectives::DataType::kFloat32;
  absl::Status gathered = group.AllGather(mine.data_ptr(), all.data_ptr(), c, dtype, timeout);
  if (!gathered.ok()) {
    return absl::Status(gathered.code(), absl::StrCat("gathering the parameters of stage ", stage,
                                                      ": ", gathered.message()));
  }
  return all;
}

absl::Status ZeroShards::GatherParameters(collectives::Collectives& group, absl::Duration timeout) {
  torch::NoGradGuard no_grad;
  for (auto& [s, layout] : layouts_) {
    if (!layout.shard.defined()) continue;
    ASSIGN_OR_RETURN(const torch::Tensor all, AllGatherShards(s, group, timeout));
    int64_t offset = 0;
    for (torch::Tensor& p : layout.params) {
      p.copy_(all.narrow(0, offset, p.numel()).view_as(p));
      offset += p.numel();
    }
  }
  return absl::OkStatus();
}

absl::Status ZeroShards::GatherStage(int stage, collectives::Collectives& group,
                                     absl::Duration timeout) {
  Layout& layout = layouts_.at(stage);
  if (!layout.shard.defined()) return absl::OkStatus();
  ASSIGN_OR_RETURN(torch::Tensor all, AllGatherShards(stage, group, timeout));
  all = all.to(layout.shard.device());
  int64_t offset = 0;
  for (size_t i = 0; i < layout.params.size(); ++i) {
    const int64_t n = c10::multiply_integers(layout.shapes[i]);
    layout.params[i].set_data(all.narrow(0, offset, n).view(layout.shapes[i]));
    offset += n;
  }
  return absl::OkStatus();
}

int64_t ZeroShards::gathered_bytes(int stage) const {
  const Layout& layout = layouts_.at(stage);
  if (!layout.shard.defined()) return 0;
  return layout.shard.numel() * replicas_ * static_cast<int64_t>(layout.shard.element_size());
}

void ZeroShards::ReleaseStage(int stage) {
  for (torch::Tensor& p : layouts_.at(stage).params) {
    p.set_data(torch::empty({0}, p.options().requires_grad(false)));
  }
}

ParameterShapes ZeroShards::ShapesOf(int stage) const {
  const Layout& layout = layouts_.at(stage);
  return ParameterShapes{layout.params, layout.shapes};
}

std::function<void()> FillEmptyWithZeros(const ParameterShapes& shapes) {
  std::vector<torch::Tensor> filled;
  for (size_t i = 0; i < shapes.params.size(); ++i) {
    torch::Tensor p = shapes.params[i];
    if (p.numel() != 0 || c10::multiply_integers(shapes.shapes[i]) == 0) continue;
    p.set_data(torch::zeros(shapes.shapes[i], p.options().requires_grad(false)));
    filled.push_back(p);
  }
  return [filled]() mutable {
    for (torch::Tensor& p : filled) {
      p.set_data(torch::empty({0}, p.options().requires_grad(false)));
    }
  };
}

absl::StatusOr<std::vector<StateSnapshot>> ZeroShards::SnapshotShardFiles(
    int64_t global_step, const torch::optim::Optimizer& optimizer) const {
  std::vector<StateSnapshot> snapshots;
  for (const auto& [s, layout] : layouts_) {
    if (!layout.shard.defined()) continue;
    ASSIGN_OR_RETURN(
        snapshots.emplace_back(),
        SnapshotState(s, global_step, OptimizerShardFileName(s, replica_, replicas_), false,
                      {{"shard", layout.shard}}, {}, optimizer, global_step, "", LayoutOf(layout)));
  }
  return snapshots;
}

absl::Status RestoreOptimizerState(const v1::ResumeTask& resume, int stage,
                                   const std::vector<std::pair<std::string, torch::Tensor>>& params,
                                   const spec::OptimizerSpec& spec,
                                   torch::optim::Optimizer& optimizer, const ZeroShards* shards) {
  if (params.empty()) return absl::OkStatus();
  int64_t numel = 0;
  std::vector<torch::Tensor> tensors;
  for (const auto& [name, p] : params) {
    numel += p.numel();
    tensors.push_back(p);
  }
  const std::string where = absl::StrCat("stage ", stage, " of checkpoint ", resume.directory());
  ASSIGN_OR_RETURN(const std::vector<ShardFile> shard_files, ShardFilesOf(resume, stage));
  StateFields flat;
  if (!shard_files.empty()) {
    ASSIGN_OR_RETURN(
        flat, FlatFromShards(resume, stage, shard_files, numel, tensors.front().options(), spec));
  } else {
    // A checkpoint written without sharding: its per-parameter state, read through a plain
    // optimizer over copies of the parameters (every check of RestoreStageCheckpoint applies).
    std::vector<std::pair<std::string, torch::Tensor>> copies;
    std::vector<torch::Tensor> copy_tensors;
    for (const auto& [name, p] : params) {
      torch::Tensor copy = p.detach().to(torch::kCPU).clone().requires_grad_(true);
      copies.emplace_back(name, copy);
      copy_tensors.push_back(copy);
    }
    ASSIGN_OR_RETURN(std::unique_ptr<torch::optim::Optimizer> reader,
                     MakeOptimizer(spec, copy_tensors));
    ASSIGN_OR_RETURN(const v1::StageCheckpointFile file, FindStageStateFile(resume, stage));
    RETURN_IF_ERROR(RestoreStageCheckpoint(resume.directory(), file, stage, copies, *reader));
    ASSIGN_OR_RETURN(flat, FlatFields(*reader, copy_tensors, numel));
  }
  try {
    if (shards != nullptr) return InstallFlatInShard(flat, stage, optimizer, *shards, where);
    int64_t offset = 0;
    for (const auto& [name, p] : params) {
      StateFields fields;
      for (const auto& [field, value] : flat) {
        fields[field] = field == "step" ? value : value.narrow(0, offset, p.numel());
      }
      offset += p.numel();
      RETURN_IF_ERROR(SetParamStateFields(optimizer, p, fields,
                                          absl::StrCat(where, " parameter '", name, "'")));
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat(where, ": restoring optimizer state failed: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

absl::Status InstallShardState(const SavedState& saved, int stage,
                               const std::vector<std::pair<std::string, torch::Tensor>>& params,
                               torch::optim::Optimizer& optimizer, const ZeroShards& shards,
                               const std::string& where) {
  if (!shards.shard(stage).defined() || params.empty()) return absl::OkStatus();
  try {
    // Each field flattened over the stage's parameters in order, zeros where one has no state.
    const torch::TensorOptions options = shards.shard(stage).options().device(torch::kCPU);
    std::set<std::string> fields;
    for (const auto& [key, value] : saved.optimizer) fields.insert(key.substr(key.rfind('.') + 1));
    StateFields flat;
    for (const std::string& field : fields) {
      std::vector<torch::Tensor> parts;
      for (const auto& [name, p] : params) {
        auto it = saved.optimizer.find(absl::StrCat(name, ".", field));
        if (field == "step") {
          if (it != saved.optimizer.end() && flat.count(field) == 0) flat[field] = it->second;
        } else {
          parts.push_back(it != saved.optimizer.end() ? it->second.to(options).reshape(-1)
                                                      : torch::zeros({p.numel()}, options));
        }
      }
      if (field != "step") flat[field] = torch::cat(parts);
    }
    return InstallFlatInShard(flat, stage, optimizer, shards, where);
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat(where, ": restoring optimizer state failed: ", e.what_without_backtrace()));
  }
}

}  // namespace stagecoach::runtime
