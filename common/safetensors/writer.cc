#include "common/safetensors/writer.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/util/durable_file.h"
#include "nlohmann/json.hpp"

namespace stagecoach::safetensors {

absl::StatusOr<std::string> EncodeHeader(const std::vector<TensorToWrite>& tensors,
                                         const std::map<std::string, std::string>& metadata,
                                         absl::string_view file_name) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    const auto error = [&](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat(file_name, ": tensor '", t.name, "': ", what));
    };
    if (t.name.empty()) return error("an empty name");
    if (t.name == "__metadata__") return error("the name is reserved for the metadata");
    if (!names.insert(t.name).second) return error("written twice");
    for (int64_t d : t.shape) {
      if (d < 0) {
        return error(absl::StrCat("negative dimension in shape [", absl::StrJoin(t.shape, ", "),
                                  "]"));
      }
    }
    const std::optional<uint64_t> bytes = ShapeBytes(t.dtype, t.shape);
    if (bytes != t.data.size()) {
      return error(absl::StrCat("shape [", absl::StrJoin(t.shape, ", "), "] of ",
                                DtypeName(t.dtype), " needs ",
                                bytes ? absl::StrCat(*bytes) : std::string("more than 2^64"),
                                " bytes, but ", t.data.size(), " were given"));
    }
    header[t.name] = {{"dtype", std::string(DtypeName(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + *bytes}}};
    offset += *bytes;
  }
  std::string text = header.dump();
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i, n >>= 8) out[i] = static_cast<char>(n & 0xff);
  return out + text;
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  absl::StatusOr<std::string> header = EncodeHeader(tensors, metadata, path);
  if (!header.ok()) return header.status();
  DurableFileOptions options;
  options.what = "safetensors file";
  auto writer = DurableFileWriter::Create(path, options);
  if (!writer.ok()) return writer.status();
  if (absl::Status s = (*writer)->Append(*header); !s.ok()) return s;
  for (const TensorToWrite& t : tensors) {
    if (absl::Status s = (*writer)->Append(t.data); !s.ok()) return s;
  }
  return (*writer)->Commit();
}

}  // namespace stagecoach::safetensors
