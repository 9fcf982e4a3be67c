// A model's weights in a directory as Hugging Face lays them out (save_pretrained and
// from_pretrained): either one `model.safetensors`, or shards `model-00001-of-0000N.safetensors`
// listed in `model.safetensors.index.json` ({"metadata": {"total_size": BYTES}, "weight_map":
// {TENSOR: SHARD}}). Reading maps every file (format.h, file.h) and holds the index and the
// shards to each other; writing lays the tensors out the same way, sharded at a size limit.
// Thread-safe for reading; a directory is written by one writer at a time.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/safetensors/file.h"
#include "common/safetensors/writer.h"

namespace stagecoach::safetensors {

inline constexpr char kSingleFileName[] = "model.safetensors";
inline constexpr char kIndexFileName[] = "model.safetensors.index.json";

struct Index {
  std::map<std::string, std::string> weight_map;  // tensor -> shard file name
  std::optional<uint64_t> total_size;             // metadata.total_size, when given
};

// Parses an index file's text. INVALID_ARGUMENT naming `file_name` (and the tensor) when it is
// not a JSON object with a "weight_map" object of strings, when a shard is not a plain file name
// ending in ".safetensors" (no directory, no "..") or when total_size is not a byte count.
absl::StatusOr<Index> ParseIndex(absl::string_view text, absl::string_view file_name);

// The tensors of a model directory.
class ModelDir {
 public:
  // Reads `dir`'s index when it has one (every shard it names must exist, hold exactly the
  // tensors the index gives it, and the sizes add up to total_size), else its model.safetensors.
  // NOT_FOUND when it has neither; INVALID_ARGUMENT naming the file and tensor for the rest.
  static absl::StatusOr<ModelDir> Open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  // Every tensor's name, sorted.
  std::vector<std::string> Names() const;
  // The tensor called `name` and the file that holds it; nullptr when there is none.
  const TensorInfo* Find(absl::string_view name, const SafetensorsFile** file = nullptr) const;
  // Its bytes; NOT_FOUND naming the directory and the tensor.
  absl::StatusOr<absl::string_view> Data(absl::string_view name) const;
  // Every file's "__metadata__", merged (the first file's value wins).
  std::map<std::string, std::string> Metadata() const;
  // The files read, in the order of their names.
  const std::vector<SafetensorsFile>& files() const { return files_; }

 private:
  std::string dir_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, std::pair<size_t, const TensorInfo*>, std::less<>> tensors_;
};

// How save_pretrained shards: the tensors in order, a new shard whenever the next tensor would
// take the current one past `max_shard_bytes` (a tensor larger than that gets one of its own).
// Returns each shard's tensor indices; one shard (possibly empty) for no tensors.
std::vector<std::vector<size_t>> PlanShards(const std::vector<uint64_t>& tensor_bytes,
                                            uint64_t max_shard_bytes);

// Writes `tensors` into `dir` (which must exist) as PlanShards lays them out: one shard as
// model.safetensors, several as model-0000i-of-0000N.safetensors and then the index (so that a
// reader never finds an index whose shards are not all there), each with `metadata`. Files of
// the other layout a previous write left (a model.safetensors, an index and its shards) are
// removed afterwards. Errors as WriteSafetensors'.
absl::Status WriteModelDir(const std::string& dir, const std::vector<TensorToWrite>& tensors,
                           uint64_t max_shard_bytes,
                           const std::map<std::string, std::string>& metadata = {});

}  // namespace stagecoach::safetensors
