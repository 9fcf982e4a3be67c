#include "coordinator/checkpoints/hf_export_index.h"

#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/safetensors/file.h"
#include "common/safetensors/model_dir.h"
#include "common/util/durable_file.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace stagecoach::coordinator {

absl::Status WriteHfExportIndex(const std::string& step_dir, const CheckpointManifest& manifest,
                                const hf::DecoderConfig& config) {
  const std::string prefix = absl::StrCat(checkpoint::kHfDirName, "/");
  nlohmann::json weight_map = nlohmann::json::object();
  uint64_t total = 0;
  bool any = false;
  for (const ManifestStage& st : manifest.stages) {
    for (const v1::StageCheckpointFile& f : st.files) {
      if (!absl::StartsWith(f.file(), prefix)) continue;
      any = true;
      const std::string path = absl::StrCat(step_dir, "/", f.file());
      absl::StatusOr<safetensors::SafetensorsFile> part = safetensors::SafetensorsFile::Open(path);
      if (!part.ok()) {
        return absl::DataLossError(absl::StrCat("checkpoint export part of stage ", st.stage, ": ",
                                                part.status().message()));
      }
      for (const safetensors::TensorInfo& t : part->header().tensors) {
        if (weight_map.contains(t.name)) {
          return absl::DataLossError(absl::StrCat(path, " holds ", t.name, ", which ",
                                                  weight_map[t.name].get<std::string>(),
                                                  " holds too"));
        }
        weight_map[t.name] = f.file().substr(prefix.size());
        total += t.NumBytes();
      }
    }
  }
  if (!any) return absl::OkStatus();
  const std::string dir = absl::StrCat(step_dir, "/", checkpoint::kHfDirName);
  const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  DurableFileOptions options;
  options.what = "checkpoint export index";
  RETURN_IF_ERROR(WriteFileDurably(absl::StrCat(dir, "/", safetensors::kIndexFileName),
                                   index.dump(2) + "\n", options));
  hf::DecoderConfig exported = config;
  exported.torch_dtype = "float32";
  options.what = "checkpoint export config";
  return WriteFileDurably(absl::StrCat(dir, "/config.json"), hf::DecoderConfigJson(exported),
                          options);
}

}  // namespace stagecoach::coordinator
