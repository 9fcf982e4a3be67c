#include "common/safetensors/model_dir.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/util/durable_file.h"
#include "nlohmann/json.hpp"

namespace stagecoach::safetensors {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

bool IsPlainShardName(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos && name != "." && name != ".." &&
         absl::EndsWith(name, ".safetensors");
}

// save_pretrained's shard names: model-00001-of-00003.safetensors.
std::string ShardName(size_t i, size_t n) {
  return absl::StrFormat("model-%05d-of-%05d.safetensors", i + 1, n);
}

bool IsShardName(const std::string& name) {
  int a = 0, b = 0;
  char tail[16] = {};
  return std::sscanf(name.c_str(), "model-%5d-of-%5d.%15s", &a, &b, tail) == 3 &&
         std::string(tail) == "safetensors";
}

absl::StatusOr<std::string> ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot be read"));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

absl::StatusOr<Index> ParseIndex(absl::string_view text, absl::string_view file_name) {
  auto error = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(file_name, ": ", what));
  };
  const json root = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) return error("not a JSON object");
  const auto map = root.find("weight_map");
  if (map == root.end() || !map->is_object()) return error("has no \"weight_map\" object");
  Index index;
  for (const auto& [tensor, shard] : map->items()) {
    if (tensor.empty()) return error("weight_map has an empty tensor name");
    if (!shard.is_string() || !IsPlainShardName(shard.get<std::string>())) {
      return error(absl::StrCat("tensor '", tensor, "': shard ", shard.dump(),
                                " is not a .safetensors file name in the same directory"));
    }
    index.weight_map[tensor] = shard.get<std::string>();
  }
  const auto metadata = root.find("metadata");
  if (metadata != root.end() && metadata->is_object()) {
    const auto total = metadata->find("total_size");
    if (total != metadata->end()) {
      // HF writes it as an integer; some tools as a float of an integral value.
      if (total->is_number_unsigned()) {
        index.total_size = total->get<uint64_t>();
      } else if (total->is_number_float() && total->get<double>() >= 0 &&
                 total->get<double>() == static_cast<double>(
                                             static_cast<uint64_t>(total->get<double>()))) {
        index.total_size = static_cast<uint64_t>(total->get<double>());
      } else {
        return error(absl::StrCat("metadata.total_size ", total->dump(), " is not a byte count"));
      }
    }
  }
  return index;
}

absl::StatusOr<ModelDir> ModelDir::Open(const std::string& dir) {
  ModelDir out;
  out.dir_ = dir;
  const std::string index_path = (fs::path(dir) / kIndexFileName).string();
  const std::string single_path = (fs::path(dir) / kSingleFileName).string();
  std::error_code ec;
  if (!fs::exists(index_path, ec)) {
    if (!fs::exists(single_path, ec)) {
      return absl::NotFoundError(absl::StrCat(dir, ": neither ", kSingleFileName, " nor ",
                                              kIndexFileName, " is there"));
    }
    absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(single_path);
    if (!file.ok()) return file.status();
    out.files_.push_back(*std::move(file));
  } else {
    absl::StatusOr<std::string> text = ReadText(index_path);
    if (!text.ok()) return text.status();
    absl::StatusOr<Index> index = ParseIndex(*text, index_path);
    if (!index.ok()) return index.status();
    std::set<std::string> shards;
    for (const auto& [tensor, shard] : index->weight_map) shards.insert(shard);
    uint64_t total = 0;
    for (const std::string& shard : shards) {
      absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open((fs::path(dir) / shard).string());
      if (!file.ok()) return file.status();
      for (const TensorInfo& t : file->header().tensors) {
        const auto listed = index->weight_map.find(t.name);
        if (listed == index->weight_map.end() || listed->second != shard) {
          return absl::InvalidArgumentError(absl::StrCat(
              file->path(), ": tensor '", t.name, "' is not listed for this shard in ",
              index_path,
              listed == index->weight_map.end() ? "" : absl::StrCat(" (it gives ", listed->second,
                                                                   ")")));
        }
        total += t.NumBytes();
      }
      out.files_.push_back(*std::move(file));
    }
    if (index->total_size && *index->total_size != total) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": metadata.total_size is ", *index->total_size,
                       " bytes, but the shards' tensors hold ", total));
    }
    for (size_t f = 0; f < out.files_.size(); ++f) {
      for (const TensorInfo& t : out.files_[f].header().tensors) out.tensors_[t.name] = {f, &t};
    }
    for (const auto& [tensor, shard] : index->weight_map) {
      if (out.tensors_.count(tensor) == 0) {
        return absl::InvalidArgumentError(absl::StrCat(index_path, ": tensor '", tensor,
                                                        "' is listed in ", shard,
                                                        ", which does not hold it"));
      }
    }
    return out;
  }
  for (const TensorInfo& t : out.files_[0].header().tensors) out.tensors_[t.name] = {0, &t};
  return out;
}

std::vector<std::string> ModelDir::Names() const {
  std::vector<std::string> names;
  for (const auto& [name, where] : tensors_) names.push_back(name);
  return names;
}

const TensorInfo* ModelDir::Find(absl::string_view name, const SafetensorsFile** file) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) return nullptr;
  if (file != nullptr) *file = &files_[it->second.first];
  return it->second.second;
}

absl::StatusOr<absl::string_view> ModelDir::Data(absl::string_view name) const {
  const SafetensorsFile* file = nullptr;
  const TensorInfo* tensor = Find(name, &file);
  if (tensor == nullptr) {
    return absl::NotFoundError(absl::StrCat(dir_, ": no tensor '", name, "'"));
  }
  return file->Data(*tensor);
}

std::map<std::string, std::string> ModelDir::Metadata() const {
  std::map<std::string, std::string> merged;
  for (const SafetensorsFile& file : files_) merged.insert(file.header().metadata.begin(),
                                                           file.header().metadata.end());
  return merged;
}

std::vector<std::vector<size_t>> PlanShards(const std::vector<uint64_t>& tensor_bytes,
                                            uint64_t max_shard_bytes) {
  std::vector<std::vector<size_t>> shards(1);
  uint64_t current = 0;
  for (size_t i = 0; i < tensor_bytes.size(); ++i) {
    if (!shards.back().empty() && current + tensor_bytes[i] > max_shard_bytes) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().push_back(i);
    current += tensor_bytes[i];
  }
  return shards;
}

absl::Status WriteModelDir(const std::string& dir, const std::vector<TensorToWrite>& tensors,
                           uint64_t max_shard_bytes,
                           const std::map<std::string, std::string>& metadata) {
  std::vector<uint64_t> bytes;
  for (const TensorToWrite& t : tensors) bytes.push_back(t.data.size());
  const std::vector<std::vector<size_t>> plan = PlanShards(bytes, max_shard_bytes);
  std::set<std::string> written;
  if (plan.size() == 1) {
    const std::string path = (fs::path(dir) / kSingleFileName).string();
    if (absl::Status s = WriteSafetensors(path, tensors, metadata); !s.ok()) return s;
    written.insert(kSingleFileName);
  } else {
    json weight_map = json::object();
    uint64_t total = 0;
    for (size_t s = 0; s < plan.size(); ++s) {
      const std::string name = ShardName(s, plan.size());
      std::vector<TensorToWrite> shard;
      for (size_t i : plan[s]) {
        shard.push_back(tensors[i]);
        weight_map[tensors[i].name] = name;
        total += bytes[i];
      }
      const absl::Status status =
          WriteSafetensors((fs::path(dir) / name).string(), shard, metadata);
      if (!status.ok()) return status;
      written.insert(name);
    }
    const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    DurableFileOptions options;
    options.what = "safetensors index";
    const absl::Status status = WriteFileDurably((fs::path(dir) / kIndexFileName).string(),
                                                 index.dump(2) + "\n", options);
    if (!status.ok()) return status;
    written.insert(kIndexFileName);
  }
  // What an earlier write of another layout left would mislead a reader.
  std::error_code ec;
  std::vector<fs::path> stale;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const bool ours = name == kSingleFileName || name == kIndexFileName || IsShardName(name);
    if (ours && written.count(name) == 0) stale.push_back(entry.path());
  }
  for (const fs::path& path : stale) fs::remove(path, ec);
  return absl::OkStatus();
}

}  // namespace stagecoach::safetensors
