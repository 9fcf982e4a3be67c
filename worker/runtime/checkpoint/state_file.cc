#include "worker/runtime/checkpoint/state_file.h"

#include <torch/serialize.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/util/sha256.h"
#include "common/util/status_macros.h"

namespace stagecoach::runtime {
namespace {

absl::StatusOr<StateFiles::Bytes> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("checkpoint file ", path, " is missing"));
  auto bytes = std::make_shared<std::vector<char>>((std::istreambuf_iterator<char>(in)),
                                                   std::istreambuf_iterator<char>());
  if (in.bad())
    return absl::DataLossError(absl::StrCat("reading checkpoint file ", path, " failed"));
  return bytes;
}

// Reads a {string -> tensor} dict out of `value` (its names in order into `order` when not
// null), or says what is wrong.
absl::StatusOr<std::map<std::string, torch::Tensor>> ReadTensorDict(
    const c10::IValue& value, const std::string& what, std::vector<std::string>* order = nullptr) {
  if (!value.isGenericDict()) return absl::DataLossError(absl::StrCat(what, " is not a dict"));
  std::map<std::string, torch::Tensor> out;
  for (const auto& entry : value.toGenericDict()) {
    if (!entry.key().isString() || !entry.value().isTensor()) {
      return absl::DataLossError(absl::StrCat(what, " has an entry that is not name -> tensor"));
    }
    out.emplace(entry.key().toStringRef(), entry.value().toTensor());
    if (order != nullptr) order->push_back(entry.key().toStringRef());
  }
  return out;
}

}  // namespace

StateFiles::StateFiles(std::string step_dir) : name_(std::move(step_dir)) {}

StateFiles::StateFiles(std::string name, std::map<std::string, Bytes> files)
    : name_(std::move(name)), memory_(std::move(files)) {}

std::string StateFiles::Where(const std::string& file) const {
  if (memory_.has_value()) return absl::StrCat(name_, ": ", file);
  return (std::filesystem::path(name_) / file).string();
}

absl::StatusOr<StateFiles::Bytes> StateFiles::Read(const std::string& file) const {
  if (!memory_.has_value()) return ReadFile(Where(file));
  auto it = memory_->find(file);
  if (it == memory_->end() || it->second == nullptr) {
    return absl::NotFoundError(absl::StrCat("checkpoint file ", Where(file), " is missing"));
  }
  return it->second;
}

absl::StatusOr<SavedState> ParseStateBytes(const std::vector<char>& bytes,
                                           const std::string& path) {
  c10::IValue root;
  try {
    root = torch::pickle_load(bytes);
  } catch (const c10::Error& e) {
    return absl::DataLossError(absl::StrCat("checkpoint file ", path,
                                            " cannot be unpickled: ", e.what_without_backtrace()));
  }
  if (!root.isGenericDict()) {
    return absl::DataLossError(absl::StrCat("checkpoint file ", path, " does not hold a dict"));
  }
  const c10::impl::GenericDict dict = root.toGenericDict();
  auto get = [&](const std::string& key) -> absl::StatusOr<c10::IValue> {
    auto it = dict.find(key);
    if (it == dict.end()) {
      return absl::DataLossError(absl::StrCat("checkpoint file ", path, " has no '", key, "'"));
    }
    return it->value();
  };
  auto get_int = [&](const std::string& key) -> absl::StatusOr<int64_t> {
    ASSIGN_OR_RETURN(c10::IValue v, get(key));
    if (!v.isInt()) {
      return absl::DataLossError(
          absl::StrCat("checkpoint file ", path, ": '", key, "' is not an integer"));
    }
    return v.toInt();
  };
  auto what = [&](const char* key) { return absl::StrCat("checkpoint file ", path, ": ", key); };
  SavedState state;
  ASSIGN_OR_RETURN(c10::IValue params, get("state_dict"));
  ASSIGN_OR_RETURN(state.params, ReadTensorDict(params, what("state_dict"), &state.param_order));
  ASSIGN_OR_RETURN(c10::IValue optimizer, get("optimizer"));
  ASSIGN_OR_RETURN(state.optimizer, ReadTensorDict(optimizer, what("optimizer")));
  if (dict.contains("buffers")) {
    ASSIGN_OR_RETURN(state.buffers, ReadTensorDict(dict.at("buffers"), what("buffers")));
  }
  if (dict.contains(kShardLayoutKey)) {
    std::vector<std::string> names;
    ASSIGN_OR_RETURN(auto shapes,
                     ReadTensorDict(dict.at(kShardLayoutKey), what(kShardLayoutKey), &names));
    for (const std::string& name : names) {
      const torch::Tensor& shape = shapes.at(name);
      if (shape.dim() != 1 || shape.scalar_type() != torch::kInt64) {
        return absl::DataLossError(absl::StrCat(what(kShardLayoutKey), ": the shape of '", name,
                                                "' is not a list of int64"));
      }
      std::vector<int64_t> sizes(shape.data_ptr<int64_t>(),
                                 shape.data_ptr<int64_t>() + shape.numel());
      state.shard_layout.emplace_back(name, std::move(sizes));
    }
  }
  ASSIGN_OR_RETURN(state.stage, get_int("stage"));
  ASSIGN_OR_RETURN(state.step, get_int("step"));
  ASSIGN_OR_RETURN(state.data_position, get_int("data_position"));
  return state;
}

std::string DescribeTensor(const torch::Tensor& t) {
  return absl::StrCat(std::string(c10::toString(t.scalar_type())), "[",
                      absl::StrJoin(t.sizes(), ", "), "]");
}

absl::StatusOr<SavedState> ReadStateFile(const StateFiles& files,
                                         const v1::StageCheckpointFile& file, int stage) {
  if (file.file().empty() || file.file().find('/') != std::string::npos || file.file() == "." ||
      file.file() == "..") {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint file name '", file.file(), "' must be a plain file name"));
  }
  if (file.stage() != stage) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint file ", file.file(), " is stage ",
                                                   file.stage(), "'s, not stage ", stage, "'s"));
  }
  const std::string path = files.Where(file.file());
  ASSIGN_OR_RETURN(const StateFiles::Bytes read, files.Read(file.file()));
  const std::vector<char>& bytes = *read;
  if (static_cast<int64_t>(bytes.size()) != file.size_bytes()) {
    return absl::DataLossError(absl::StrCat("checkpoint file ", path, " is corrupt: expected ",
                                            file.size_bytes(), " bytes, found ", bytes.size()));
  }
  const std::string sha = Sha256Hex(absl::string_view(bytes.data(), bytes.size()));
  if (sha != file.sha256()) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint file ", path, " is corrupt: expected sha256 ", file.sha256(), ", found ", sha));
  }
  ASSIGN_OR_RETURN(SavedState saved, ParseStateBytes(bytes, path));
  if (saved.stage != stage) {
    return absl::DataLossError(absl::StrCat("checkpoint file ", path, " holds stage ", saved.stage,
                                            ", expected stage ", stage));
  }
  return saved;
}

}  // namespace stagecoach::runtime
