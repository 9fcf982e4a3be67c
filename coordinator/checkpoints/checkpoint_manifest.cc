// Checkpoint manifests (see checkpoint_manifest.h).
#include "coordinator/checkpoints/checkpoint_manifest.h"

#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/hf/decoder_config.h"
#include "common/util/durable_file.h"
#include "common/util/sha256.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace stagecoach::coordinator {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

absl::Status CheckConsistent(const CheckpointManifest& m) {
  if (m.num_stages < 1 || static_cast<int>(m.stages.size()) != m.num_stages) {
    return absl::InvalidArgumentError(absl::StrCat("manifest: num_stages is ", m.num_stages,
                                                   " but ", m.stages.size(), " stages are listed"));
  }
  for (int s = 0; s < m.num_stages; ++s) {
    const ManifestStage& st = m.stages[s];
    if (st.stage != s) {
      return absl::InvalidArgumentError(
          absl::StrCat("manifest: stages[", s, "] is stage ", st.stage, ", expected ", s));
    }
    if (st.files.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("manifest: stage ", s, " has no files"));
    }
    for (const v1::StageCheckpointFile& f : st.files) {
      if (f.stage() != s || !checkpoint::IsCheckpointFileName(f.file()) || f.size_bytes() < 0 ||
          !IsSha256Hex(f.sha256())) {
        return absl::InvalidArgumentError(
            absl::StrCat("manifest: stage ", s, " file entry '", f.file(), "' (stage ", f.stage(),
                         ") needs a plain file name (or hf/ and one) of that stage, a size and a sha256"));
      }
    }
  }
  return absl::OkStatus();
}

json ToJson(const CheckpointManifest& m) {
  json stages = json::array();
  for (const ManifestStage& st : m.stages) {
    json files = json::array();
    for (const v1::StageCheckpointFile& f : st.files) {
      files.push_back({{"file", f.file()}, {"size_bytes", f.size_bytes()}, {"sha256", f.sha256()}});
    }
    stages.push_back({{"stage", st.stage},
                      {"first_layer", st.first_layer},
                      {"end_layer", st.end_layer},
                      {"layers", st.layers},
                      {"files", files}});
  }
  json model = json::object();
  if (!m.model_json.empty()) model = json::parse(m.model_json, nullptr, false);
  if (model.is_discarded()) model = json::object();
  return {{"format", kManifestFormat},
          {"job_id", m.job_id},
          {"step", m.step},
          {"data_position", m.data_position},
          {"num_stages", m.num_stages},
          {"schedule", m.schedule},
          {"model", model},
          {"stages", stages}};
}

// Reads field `key` of object `obj` as T, or says which field of `path` is wrong.
template <typename T>
absl::Status Field(const json& obj, const std::string& key, const std::string& where, T* out) {
  auto it = obj.find(key);
  if (it == obj.end()) return absl::DataLossError(absl::StrCat(where, ": '", key, "' is missing"));
  if constexpr (std::is_integral_v<T>) {
    // get<T>() converts a JSON float (4e20) or an out-of-range integer with undefined behaviour:
    // only integers that fit T are read.
    static_assert(std::is_signed_v<T>, "manifest integers are signed");
    const bool fits =
        it->is_number_unsigned()
            ? it->template get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max())
        : it->is_number_integer() ? it->template get<int64_t>() >= std::numeric_limits<T>::min() &&
                                        it->template get<int64_t>() <= std::numeric_limits<T>::max()
                                  : false;
    if (!fits) {
      return absl::DataLossError(
          absl::StrCat(where, ": '", key, "' is not an integer in range: ", it->dump()));
    }
  }
  try {
    *out = it->template get<T>();
  } catch (const json::exception& e) {
    return absl::DataLossError(absl::StrCat(where, ": '", key, "' has the wrong type"));
  }
  return absl::OkStatus();
}

absl::StatusOr<CheckpointManifest> FromJson(const json& j, const std::string& path) {
  if (!j.is_object()) return absl::DataLossError(absl::StrCat(path, ": not a JSON object"));
  CheckpointManifest m;
  std::string format;
  RETURN_IF_ERROR(Field(j, "format", path, &format));
  if (format != kManifestFormat) {
    return absl::DataLossError(
        absl::StrCat(path, ": format '", format, "' is not ", kManifestFormat));
  }
  RETURN_IF_ERROR(Field(j, "job_id", path, &m.job_id));
  RETURN_IF_ERROR(Field(j, "step", path, &m.step));
  RETURN_IF_ERROR(Field(j, "data_position", path, &m.data_position));
  RETURN_IF_ERROR(Field(j, "num_stages", path, &m.num_stages));
  RETURN_IF_ERROR(Field(j, "schedule", path, &m.schedule));
  if (auto model = j.find("model"); model != j.end()) m.model_json = model->dump();
  json stages;
  RETURN_IF_ERROR(Field(j, "stages", path, &stages));
  if (!stages.is_array()) return absl::DataLossError(absl::StrCat(path, ": 'stages' not a list"));
  for (size_t i = 0; i < stages.size(); ++i) {
    const std::string where = absl::StrCat(path, ": stages[", i, "]");
    const json& js = stages[i];
    if (!js.is_object()) return absl::DataLossError(absl::StrCat(where, ": not an object"));
    ManifestStage& st = m.stages.emplace_back();
    RETURN_IF_ERROR(Field(js, "stage", where, &st.stage));
    RETURN_IF_ERROR(Field(js, "first_layer", where, &st.first_layer));
    RETURN_IF_ERROR(Field(js, "end_layer", where, &st.end_layer));
    if (js.contains("layers")) RETURN_IF_ERROR(Field(js, "layers", where, &st.layers));
    json files;
    RETURN_IF_ERROR(Field(js, "files", where, &files));
    if (!files.is_array()) return absl::DataLossError(absl::StrCat(where, ": 'files' not a list"));
    for (size_t k = 0; k < files.size(); ++k) {
      const std::string fwhere = absl::StrCat(where, ".files[", k, "]");
      if (!files[k].is_object())
        return absl::DataLossError(absl::StrCat(fwhere, ": not an object"));
      std::string name, sha;
      int64_t size = 0;
      RETURN_IF_ERROR(Field(files[k], "file", fwhere, &name));
      RETURN_IF_ERROR(Field(files[k], "size_bytes", fwhere, &size));
      RETURN_IF_ERROR(Field(files[k], "sha256", fwhere, &sha));
      v1::StageCheckpointFile& f = st.files.emplace_back();
      f.set_stage(st.stage);
      f.set_file(name);
      f.set_size_bytes(size);
      f.set_sha256(sha);
    }
  }
  absl::Status consistent = CheckConsistent(m);
  if (!consistent.ok()) return absl::DataLossError(absl::StrCat(path, ": ", consistent.message()));
  return m;
}

}  // namespace

std::string ModelReferenceJson(const spec::ModelSpec& model) {
  json out = json::object();
  if (model.torchscript.has_value()) out["torchscript"] = *model.torchscript;
  if (model.builtin.has_value()) {
    const spec::BuiltinModel& b = *model.builtin;
    json builtin = {{"family", b.family}, {"seed", b.seed}};
    if (b.family == "mlp") {
      builtin["sizes"] = b.sizes;
    } else if (b.decoder.has_value()) {
      // llama: its whole configuration, as config.json holds it, and the training window.
      builtin["config"] = json::parse(hf::DecoderConfigJson(*b.decoder));
      builtin["seq"] = b.seq;
      if (!b.weights_dir.empty()) builtin["weights_dir"] = b.weights_dir;
    } else {
      builtin.update({{"vocab", b.vocab},
                      {"d_model", b.d_model},
                      {"layers", b.layers},
                      {"heads", b.heads},
                      {"seq", b.seq}});
    }
    out["builtin"] = builtin;
  }
  return out.dump();
}

absl::Status WriteManifest(const std::string& step_dir, const CheckpointManifest& manifest) {
  RETURN_IF_ERROR(CheckConsistent(manifest));
  DurableFileOptions options;
  options.if_exists = DurableFileOptions::IfExists::kFail;
  options.what = "checkpoint manifest";
  return WriteFileDurably(ManifestPath(step_dir), ToJson(manifest).dump(2) + "\n", options);
}

absl::StatusOr<CheckpointManifest> ReadManifest(const std::string& step_dir) {
  std::error_code ec;
  if (!fs::is_directory(step_dir, ec)) {
    return absl::NotFoundError(absl::StrCat("checkpoint ", step_dir, " is not a directory"));
  }
  const std::string path = ManifestPath(step_dir);
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::FailedPreconditionError(
        absl::StrCat("partial checkpoint: ", step_dir, " has no ", kManifestFileName));
  }
  std::stringstream text;
  text << in.rdbuf();
  json j = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::DataLossError(absl::StrCat(path, ": not valid JSON"));
  return FromJson(j, path);
}

absl::StatusOr<CheckpointManifest> VerifyCheckpoint(const std::string& step_dir) {
  ASSIGN_OR_RETURN(CheckpointManifest m, ReadManifest(step_dir));
  for (const ManifestStage& st : m.stages) {
    for (const v1::StageCheckpointFile& f : st.files) {
      const std::string path = (fs::path(step_dir) / f.file()).string();
      std::error_code ec;
      const auto size = fs::file_size(path, ec);
      if (ec) {
        return absl::DataLossError(absl::StrCat("checkpoint ", step_dir, ": ", f.file(), " (stage ",
                                                st.stage, ") is missing"));
      }
      if (static_cast<int64_t>(size) != f.size_bytes()) {
        return absl::DataLossError(absl::StrCat("checkpoint ", step_dir, ": ", f.file(), " has ",
                                                size, " bytes, the manifest says ",
                                                f.size_bytes()));
      }
      ASSIGN_OR_RETURN(std::string sha, Sha256OfFile(path));
      if (sha != f.sha256()) {
        return absl::DataLossError(absl::StrCat("checkpoint ", step_dir, ": ", f.file(),
                                                " has sha256 ", sha, ", the manifest says ",
                                                f.sha256()));
      }
    }
  }
  return m;
}

}  // namespace stagecoach::coordinator
