// Stage checkpoint files (see checkpoint.h for the layout).
#include "worker/runtime/checkpoint/checkpoint.h"

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <type_traits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/util/durable_file.h"
#include "common/util/sha256.h"
#include "common/util/status_macros.h"
#include "worker/runtime/checkpoint/optimizer_state.h"
#include "worker/runtime/checkpoint/state_file.h"
#include "worker/runtime/checkpoint/torch_save.h"

namespace stagecoach::runtime {
namespace {

namespace fs = std::filesystem;

template <typename Optim>
const torch::optim::OptimizerParamState* FindState(const Optim& optimizer,
                                                   const torch::Tensor& param) {
  const auto& state = optimizer.state();
  auto it = state.find(OptimizerStateKey<std::decay_t<decltype(state)>>(param));
  return it == state.end() ? nullptr : it->second.get();
}

enum class OptimizerKind { kSgd, kAdamW };

absl::StatusOr<OptimizerKind> KindOf(const torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer) != nullptr) return OptimizerKind::kAdamW;
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer) != nullptr) return OptimizerKind::kSgd;
  return absl::UnimplementedError(
      "checkpoint: only sgd and adamw optimizer state can be checkpointed");
}

const char* KindName(OptimizerKind kind) { return kind == OptimizerKind::kSgd ? "sgd" : "adamw"; }

// The optimizer-state fields a kind writes; the first ones are required when a parameter has
// state at all.
const std::vector<std::string>& FieldsOf(OptimizerKind kind) {
  static const std::vector<std::string> sgd = {"momentum_buffer"};
  static const std::vector<std::string> adamw = {"exp_avg", "exp_avg_sq", "step", "max_exp_avg_sq"};
  return kind == OptimizerKind::kSgd ? sgd : adamw;
}

// A copy in host memory, which later steps do not change; pinned when it comes from a device,
// so that the copy runs at the link's speed.
torch::Tensor HostCopy(const torch::Tensor& t) {
  if (t.device().is_cpu()) return t.detach().clone();
  torch::Tensor host = torch::empty(t.sizes(), t.options().device(torch::kCPU).pinned_memory(true));
  host.copy_(t.detach());
  return host;
}

std::string PathIn(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / name).string();
}

c10::Dict<std::string, torch::Tensor> TensorDict(
    const std::vector<std::pair<std::string, torch::Tensor>>& entries) {
  c10::Dict<std::string, torch::Tensor> dict;
  for (const auto& [name, t] : entries) dict.insert(name, t);
  return dict;
}

// One parameter's optimizer state, as written to / read from the "optimizer" dict.
struct ParamOptimState {
  std::map<std::string, torch::Tensor> fields;  // field -> tensor
};

absl::Status CheckFieldShape(const std::string& key, const torch::Tensor& value,
                             const torch::Tensor& param, const std::string& where) {
  if (value.sizes() != param.sizes() || value.scalar_type() != param.scalar_type()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": optimizer state '", key, "' is ",
                                                   DescribeTensor(value), ", the parameter is ",
                                                   DescribeTensor(param)));
  }
  return absl::OkStatus();
}

// Builds the optimizer state object of one parameter from its fields (checked against the kind
// and the parameter); nullptr when the parameter has no state.
absl::StatusOr<std::unique_ptr<torch::optim::OptimizerParamState>> MakeParamState(
    OptimizerKind kind, const std::string& name, const ParamOptimState& in,
    const torch::Tensor& param, const std::string& where) {
  if (in.fields.empty()) return std::unique_ptr<torch::optim::OptimizerParamState>();
  auto need = [&](const std::string& field) -> absl::StatusOr<torch::Tensor> {
    auto it = in.fields.find(field);
    if (it == in.fields.end()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": optimizer state of parameter '",
                                                     name, "' lacks '", name, ".", field, "'"));
    }
    return it->second;
  };
  const auto opts = param.options();
  if (kind == OptimizerKind::kSgd) {
    ASSIGN_OR_RETURN(torch::Tensor buf, need("momentum_buffer"));
    RETURN_IF_ERROR(CheckFieldShape(name + ".momentum_buffer", buf, param, where));
    auto state = std::make_unique<torch::optim::SGDParamState>();
    state->momentum_buffer(buf.to(opts).clone());
    return std::unique_ptr<torch::optim::OptimizerParamState>(std::move(state));
  }
  ASSIGN_OR_RETURN(torch::Tensor exp_avg, need("exp_avg"));
  ASSIGN_OR_RETURN(torch::Tensor exp_avg_sq, need("exp_avg_sq"));
  ASSIGN_OR_RETURN(torch::Tensor step, need("step"));
  RETURN_IF_ERROR(CheckFieldShape(name + ".exp_avg", exp_avg, param, where));
  RETURN_IF_ERROR(CheckFieldShape(name + ".exp_avg_sq", exp_avg_sq, param, where));
  if (step.numel() != 1 || step.is_floating_point()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": optimizer state '", name,
                                                   ".step' must be one integer, got ",
                                                   DescribeTensor(step)));
  }
  auto state = std::make_unique<torch::optim::AdamWParamState>();
  state->step(step.item<int64_t>());
  state->exp_avg(exp_avg.to(opts).clone());
  state->exp_avg_sq(exp_avg_sq.to(opts).clone());
  if (auto it = in.fields.find("max_exp_avg_sq"); it != in.fields.end()) {
    RETURN_IF_ERROR(CheckFieldShape(name + ".max_exp_avg_sq", it->second, param, where));
    state->max_exp_avg_sq(it->second.to(opts).clone());
  }
  return std::unique_ptr<torch::optim::OptimizerParamState>(std::move(state));
}

// Whether `param` is one of the optimizer's parameters.
bool Optimizes(const torch::optim::Optimizer& optimizer, const torch::Tensor& param) {
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      if (p.unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) return true;
    }
  }
  return false;
}

}  // namespace

absl::StatusOr<StateSnapshot> SnapshotState(
    int stage, int64_t global_step, const std::string& file_name, bool with_export,
    const std::vector<std::pair<std::string, torch::Tensor>>& params,
    const std::vector<std::pair<std::string, torch::Tensor>>& buffers,
    const torch::optim::Optimizer& optimizer, int64_t data_position, const std::string& omitted,
    const ShardLayout& shard_layout) {
  ASSIGN_OR_RETURN(OptimizerKind kind, KindOf(optimizer));
  StateSnapshot out;
  out.stage = stage;
  out.global_step = global_step;
  out.data_position = data_position;
  out.file_name = file_name;
  out.with_export = with_export;
  out.shard_layout = shard_layout;
  try {
    for (const auto& [name, p] : params) {
      if (name == omitted) continue;
      out.values.emplace_back(name, HostCopy(p));
      const torch::optim::OptimizerParamState* st = FindState(optimizer, p);
      if (st == nullptr) continue;
      if (kind == OptimizerKind::kSgd) {
        const auto& sgd = static_cast<const torch::optim::SGDParamState&>(*st);
        if (sgd.momentum_buffer().defined()) {
          out.optimizer.emplace_back(name + ".momentum_buffer", HostCopy(sgd.momentum_buffer()));
        }
      } else {
        const auto& adam = static_cast<const torch::optim::AdamWParamState&>(*st);
        out.optimizer.emplace_back(name + ".exp_avg", HostCopy(adam.exp_avg()));
        out.optimizer.emplace_back(name + ".exp_avg_sq", HostCopy(adam.exp_avg_sq()));
        out.optimizer.emplace_back(name + ".step", torch::tensor(adam.step(), torch::kInt64));
        if (adam.max_exp_avg_sq().defined()) {
          out.optimizer.emplace_back(name + ".max_exp_avg_sq", HostCopy(adam.max_exp_avg_sq()));
        }
      }
    }
    for (const auto& [name, b] : buffers) out.buffers.emplace_back(name, HostCopy(b));
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("checkpoint: copying stage ", stage,
                                            "'s state failed: ", e.what_without_backtrace()));
  }
  return out;
}

// The pickled training-state dict of a snapshot (layout in checkpoint.h), and its export when
// `export_bytes` is not null.
static absl::StatusOr<std::vector<char>> SnapshotBytes(const StateSnapshot& snapshot,
                                                       std::vector<char>* export_bytes) {
  try {
    c10::impl::GenericDict root(c10::StringType::get(), c10::AnyType::get());
    root.insert("state_dict", TensorDict(snapshot.values));
    root.insert("buffers", TensorDict(snapshot.buffers));
    root.insert("optimizer", TensorDict(snapshot.optimizer));
    root.insert("stage", static_cast<int64_t>(snapshot.stage));
    root.insert("step", snapshot.global_step);
    root.insert("data_position", snapshot.data_position);
    if (!snapshot.shard_layout.empty()) {
      c10::Dict<std::string, torch::Tensor> shapes;
      for (const auto& [name, sizes] : snapshot.shard_layout) {
        shapes.insert(name, torch::tensor(sizes, torch::kInt64));
      }
      root.insert(kShardLayoutKey, shapes);
    }
    // TorchSaveBytes, not torch::pickle_save: files that PyTorch >= 2.6 loads with its default
    // weights_only=True.
    // The export is a state_dict as PyTorch's modules make it: parameters and buffers.
    if (export_bytes != nullptr) {
      std::vector<std::pair<std::string, torch::Tensor>> exported = snapshot.values;
      exported.insert(exported.end(), snapshot.buffers.begin(), snapshot.buffers.end());
      *export_bytes = TorchSaveBytes(c10::IValue(TensorDict(exported)));
    }
    return TorchSaveBytes(c10::IValue(root));
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("checkpoint: saving stage ", snapshot.stage,
                                            " failed: ", e.what_without_backtrace()));
  }
}

absl::StatusOr<std::vector<char>> PickleSnapshot(const StateSnapshot& snapshot) {
  return SnapshotBytes(snapshot, nullptr);
}

// Creates the step directory of `global_step` in `dir`.
static absl::StatusOr<std::string> MakeStepDir(const std::string& dir, int64_t global_step) {
  const std::string step_dir = CheckpointStepDir(dir, global_step);
  std::error_code ec;
  fs::create_directories(step_dir, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("training.checkpoint.dir: cannot create ", step_dir, ": ", ec.message()));
  }
  return step_dir;
}

// Writes `bytes` durably as `name` in `step_dir` (never over an existing file); its entry.
static absl::StatusOr<v1::StageCheckpointFile> WriteEntry(const std::string& step_dir, int stage,
                                                          const std::string& name,
                                                          const std::vector<char>& bytes) {
  DurableFileOptions options;
  options.if_exists = DurableFileOptions::IfExists::kFail;
  options.what = "checkpoint file";
  RETURN_IF_ERROR(WriteFileDurably(PathIn(step_dir, name),
                                   absl::string_view(bytes.data(), bytes.size()), options));
  v1::StageCheckpointFile f;
  f.set_stage(stage);
  f.set_file(name);
  f.set_size_bytes(static_cast<int64_t>(bytes.size()));
  f.set_sha256(Sha256Hex(absl::string_view(bytes.data(), bytes.size())));
  return f;
}

absl::StatusOr<std::vector<v1::StageCheckpointFile>> WriteSnapshot(const std::string& dir,
                                                                   const StateSnapshot& snapshot) {
  std::vector<char> export_bytes;
  ASSIGN_OR_RETURN(std::vector<char> state_bytes,
                   SnapshotBytes(snapshot, snapshot.with_export ? &export_bytes : nullptr));
  ASSIGN_OR_RETURN(const std::string step_dir, MakeStepDir(dir, snapshot.global_step));
  std::vector<v1::StageCheckpointFile> files;
  ASSIGN_OR_RETURN(files.emplace_back(),
                   WriteEntry(step_dir, snapshot.stage, snapshot.file_name, state_bytes));
  if (snapshot.with_export) {
    ASSIGN_OR_RETURN(
        files.emplace_back(),
        WriteEntry(step_dir, snapshot.stage, StageExportFileName(snapshot.stage), export_bytes));
  }
  return files;
}

absl::StatusOr<std::vector<v1::StageCheckpointFile>> WriteStageCheckpoint(
    const std::string& dir, int64_t global_step, int stage,
    const std::vector<std::pair<std::string, torch::Tensor>>& params,
    const std::vector<std::pair<std::string, torch::Tensor>>& buffers,
    const torch::optim::Optimizer& optimizer, int64_t data_position,
    const std::string& omitted) {
  ASSIGN_OR_RETURN(const StateSnapshot snapshot,
                   SnapshotState(stage, global_step, StageStateFileName(stage), true, params,
                                 buffers, optimizer, data_position, omitted));
  return WriteSnapshot(dir, snapshot);
}

absl::StatusOr<v1::StageCheckpointFile> WriteStateFile(
    const std::string& dir, int64_t global_step, int stage, const std::string& file_name,
    const std::vector<std::pair<std::string, torch::Tensor>>& params,
    const torch::optim::Optimizer& optimizer, int64_t data_position,
    const ShardLayout& shard_layout) {
  ASSIGN_OR_RETURN(const StateSnapshot snapshot,
                   SnapshotState(stage, global_step, file_name, false, params, {}, optimizer,
                                 data_position, "", shard_layout));
  ASSIGN_OR_RETURN(std::vector<v1::StageCheckpointFile> files, WriteSnapshot(dir, snapshot));
  return files.front();
}

absl::StatusOr<v1::StageCheckpointFile> FindStageStateFile(const v1::ResumeTask& resume,
                                                           int stage) {
  const std::string want = StageStateFileName(stage);
  for (const v1::StageCheckpointFile& f : resume.files()) {
    if (f.stage() == stage && f.file() == want) return f;
  }
  return absl::InvalidArgumentError(absl::StrCat("resume.files: no ", want, " for stage ", stage,
                                                 " of checkpoint ", resume.directory()));
}

// The saved tensors of one kind ("parameter", "buffer") are exactly `live`'s names, shapes and
// dtypes. Returns their names.
static absl::StatusOr<std::set<std::string>> CheckTensorsFit(
    const std::map<std::string, torch::Tensor>& saved,
    const std::vector<std::pair<std::string, torch::Tensor>>& live, const char* kind,
    const std::string& where) {
  std::set<std::string> names;
  for (const auto& [name, t] : live) {
    names.insert(name);
    auto it = saved.find(name);
    if (it == saved.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", kind, " '", name, "' of the stage is not in the checkpoint"));
    }
    if (it->second.sizes() != t.sizes() || it->second.scalar_type() != t.scalar_type()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", kind, " '", name, "' is ", DescribeTensor(it->second),
                       " in the checkpoint, ", DescribeTensor(t), " in the stage"));
    }
  }
  for (const auto& [name, t] : saved) {
    if (names.count(name) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", kind, " '", name, "' in the checkpoint is not in the stage"));
    }
  }
  return names;
}

// 2a. The saved parameters are exactly the stage's, with their shapes and dtypes, and (with an
// optimizer) ones it updates. Returns the stage's parameter names.
static absl::StatusOr<std::set<std::string>> CheckParametersFit(
    const SavedState& saved, const std::vector<std::pair<std::string, torch::Tensor>>& params,
    torch::optim::Optimizer* optimizer, const std::string& where) {
  ASSIGN_OR_RETURN(std::set<std::string> names,
                   CheckTensorsFit(saved.params, params, "parameter", where));
  for (const auto& [name, p] : params) {
    if (optimizer != nullptr && !Optimizes(*optimizer, p)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": parameter '", name, "' is not one the optimizer updates"));
    }
  }
  return names;
}

// 2b. The saved optimizer state, by parameter: every entry is `kind`'s state of a parameter of
// the stage.
static absl::StatusOr<std::map<std::string, ParamOptimState>> MatchOptimizerState(
    const SavedState& saved, const std::set<std::string>& names, OptimizerKind kind,
    const std::string& where) {
  std::map<std::string, ParamOptimState> optim;
  for (const auto& [key, value] : saved.optimizer) {
    bool matched = false;
    for (const std::string& field : FieldsOf(kind)) {
      const std::string suffix = "." + field;
      if (!absl::EndsWith(key, suffix)) continue;
      const std::string name = key.substr(0, key.size() - suffix.size());
      if (names.count(name) == 0) continue;
      optim[name].fields[field] = value;
      matched = true;
      break;
    }
    if (!matched) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": optimizer state '", key, "' is not ", KindName(kind),
                       " state of a parameter of the stage (was the optimizer changed?)"));
    }
  }
  return optim;
}

// 3. Install: the parameters' values, and (with an optimizer) each parameter's state.
static absl::Status InstallStageState(
    const SavedState& saved, const std::vector<std::pair<std::string, torch::Tensor>>& params,
    torch::optim::Optimizer* optimizer,
    std::vector<std::unique_ptr<torch::optim::OptimizerParamState>> states,
    const std::string& where) {
  try {
    torch::NoGradGuard no_grad;
    for (const auto& [name, p] : params) {
      torch::Tensor param = p;
      param.copy_(saved.params.at(name).to(p.device()));
    }
    if (optimizer == nullptr) return absl::OkStatus();
    auto& state_map = optimizer->state();
    using StateMap = std::decay_t<decltype(state_map)>;
    for (size_t i = 0; i < params.size(); ++i) {
      const torch::Tensor& p = params[i].second;
      const auto key = OptimizerStateKey<StateMap>(p);
      if (states[i] == nullptr) {
        state_map.erase(key);
      } else {
        state_map[key] = std::move(states[i]);
      }
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat(where, ": restoring failed: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

// 2c. The saved buffers are exactly `buffers`' names, shapes and dtypes (nothing to check when the
// caller restores no buffers).
static absl::Status CheckBuffersFit(
    const SavedState& saved, const std::vector<std::pair<std::string, torch::Tensor>>& buffers,
    const std::string& where) {
  if (buffers.empty()) return absl::OkStatus();
  if (!saved.buffers.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": the stage has buffers (", buffers[0].first,
                     ", ...) but the checkpoint has none (written before buffers were kept)"));
  }
  return CheckTensorsFit(*saved.buffers, buffers, "buffer", where).status();
}

absl::Status RestoreSavedState(SavedState saved, const std::string& where,
                               const std::vector<std::pair<std::string, torch::Tensor>>& params,
                               torch::optim::Optimizer* optimizer,
                               const std::vector<std::pair<std::string, torch::Tensor>>& buffers) {
  OptimizerKind kind = OptimizerKind::kSgd;
  if (optimizer != nullptr) {
    ASSIGN_OR_RETURN(kind, KindOf(*optimizer));
  }
  ASSIGN_OR_RETURN(const std::set<std::string> names,
                   CheckParametersFit(saved, params, optimizer, where));
  RETURN_IF_ERROR(CheckBuffersFit(saved, buffers, where));
  if (optimizer == nullptr) saved.optimizer.clear();  // parameters only
  ASSIGN_OR_RETURN(auto optim, MatchOptimizerState(saved, names, kind, where));
  std::vector<std::unique_ptr<torch::optim::OptimizerParamState>> states;
  try {
    for (const auto& [name, p] : params) {
      if (optimizer == nullptr) break;
      ASSIGN_OR_RETURN(auto st, MakeParamState(kind, name, optim[name], p, where));
      states.push_back(std::move(st));
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat(where, ": reading optimizer state failed: ", e.what_without_backtrace()));
  }
  RETURN_IF_ERROR(InstallStageState(saved, params, optimizer, std::move(states), where));
  try {
    torch::NoGradGuard no_grad;
    for (const auto& [name, b] : buffers) {
      torch::Tensor buffer = b;
      buffer.copy_(saved.buffers->at(name).to(b.device()));
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat(where, ": restoring buffers failed: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

// RestoreStageCheckpoint, and with `optimizer` null RestoreStageParameters.
static absl::Status RestoreStage(
    const StateFiles& files, const v1::StageCheckpointFile& file, int stage,
    const std::vector<std::pair<std::string, torch::Tensor>>& params,
    torch::optim::Optimizer* optimizer,
    const std::vector<std::pair<std::string, torch::Tensor>>& buffers) {
  ASSIGN_OR_RETURN(SavedState saved, ReadStateFile(files, file, stage));
  return RestoreSavedState(std::move(saved),
                           absl::StrCat("stage ", stage, " checkpoint ", files.Where(file.file())),
                           params, optimizer, buffers);
}

absl::Status RestoreParameterCopy(const StateFiles& files, const v1::StageCheckpointFile& file,
                                  int stage, const std::string& source,
                                  const std::pair<std::string, torch::Tensor>& copy,
                                  torch::optim::Optimizer* optimizer) {
  ASSIGN_OR_RETURN(SavedState saved, ReadStateFile(files, file, stage));
  const std::string where = absl::StrCat("stage ", stage, " checkpoint ", files.Where(file.file()),
                                         " (for ", copy.first, ")");
  auto it = saved.params.find(source);
  if (it == saved.params.end()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": it has no parameter '", source, "'"));
  }
  // The source parameter and its optimizer state, under the copy's name.
  SavedState one;
  one.stage = saved.stage;
  one.params[copy.first] = it->second;
  const std::string prefix = source + ".";
  for (const auto& [key, value] : saved.optimizer) {
    if (absl::StartsWith(key, prefix)) one.optimizer[copy.first + key.substr(source.size())] = value;
  }
  return RestoreSavedState(std::move(one), where, {copy}, optimizer, {});
}

absl::Status RestoreStageCheckpoint(
    const StateFiles& files, const v1::StageCheckpointFile& file, int stage,
    const std::vector<std::pair<std::string, torch::Tensor>>& params,
    torch::optim::Optimizer& optimizer,
    const std::vector<std::pair<std::string, torch::Tensor>>& buffers) {
  return RestoreStage(files, file, stage, params, &optimizer, buffers);
}

absl::Status RestoreStageParameters(
    const StateFiles& files, const v1::StageCheckpointFile& file, int stage,
    const std::vector<std::pair<std::string, torch::Tensor>>& params,
    const std::vector<std::pair<std::string, torch::Tensor>>& buffers) {
  return RestoreStage(files, file, stage, params, nullptr, buffers);
}

}  // namespace stagecoach::runtime
