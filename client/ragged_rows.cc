#include "client/ragged_rows.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/npy.h"
#include "client/npy_object_rows.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace stagecoach::client {
namespace {

constexpr int64_t kIgnoredRowTarget = -100;

struct RaggedRow {
  std::vector<int64_t> inputs, targets;
};

// `value` as ids: an array of integers, each >= 0 (or kIgnoredRowTarget where `targets`).
absl::StatusOr<std::vector<int64_t>> RaggedRowIds(const nlohmann::json& value, bool targets,
                                                  const std::string& where) {
  if (!value.is_array()) return absl::InvalidArgumentError(absl::StrCat(where, ": not an array"));
  std::vector<int64_t> ids;
  for (size_t i = 0; i < value.size(); ++i) {
    const nlohmann::json& v = value[i];
    const bool ok = v.is_number_integer() &&
                    (v.get<int64_t>() >= 0 || (targets && v.get<int64_t>() == kIgnoredRowTarget));
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(where, "[", i, "]: ", v.dump(), " is not ",
                                                     targets ? "an id or -100" : "an id (>= 0)"));
    }
    ids.push_back(v.get<int64_t>());
  }
  return ids;
}

// One line of a .jsonl file as a row.
absl::StatusOr<RaggedRow> JsonlRow(const std::string& text, bool forward_only,
                                   const std::string& where) {
  const nlohmann::json line = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  RaggedRow row;
  if (line.is_array()) {
    absl::StatusOr<std::vector<int64_t>> ids = RaggedRowIds(line, false, where);
    if (!ids.ok()) return ids.status();
    if (forward_only) {
      row.inputs = *std::move(ids);
    } else {
      if (ids->size() < 2) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": a document needs 2 or more ids to predict one"));
      }
      row.inputs.assign(ids->begin(), ids->end() - 1);
      row.targets.assign(ids->begin() + 1, ids->end());
    }
  } else if (line.is_object() && line.contains("inputs")) {
    absl::StatusOr<std::vector<int64_t>> inputs =
        RaggedRowIds(line["inputs"], false, absl::StrCat(where, ": inputs"));
    if (!inputs.ok()) return inputs.status();
    row.inputs = *std::move(inputs);
    if (!forward_only) {
      if (!line.contains("targets")) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": no \"targets\" (a training step needs them)"));
      }
      absl::StatusOr<std::vector<int64_t>> targets =
          RaggedRowIds(line["targets"], true, absl::StrCat(where, ": targets"));
      if (!targets.ok()) return targets.status();
      row.targets = *std::move(targets);
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": not a JSON array of ids or an object with \"inputs\" (and \"targets\")"));
  }
  if (row.inputs.empty()) return absl::InvalidArgumentError(absl::StrCat(where, ": no ids"));
  if (!forward_only && row.targets.size() != row.inputs.size()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", row.inputs.size(), " inputs but ",
                                                   row.targets.size(), " targets"));
  }
  return row;
}

absl::StatusOr<std::vector<RaggedRow>> ReadJsonlRows(const std::string& path, bool forward_only) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("--inputs: cannot open '", path, "': ", std::strerror(errno)));
  }
  std::vector<RaggedRow> rows;
  std::string text;
  for (int64_t line = 1; std::getline(in, text); ++line) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    absl::StatusOr<RaggedRow> row =
        JsonlRow(text, forward_only, absl::StrCat("--inputs: '", path, "' line ", line));
    if (!row.ok()) return row.status();
    rows.push_back(*std::move(row));
  }
  return rows;
}

// The rows of an .npy file: a 1-D int32 or int64 array is one row, an object array
// (npy_object_rows.h) one row per element.
absl::StatusOr<std::vector<std::vector<int64_t>>> NpyRows(const std::string& path,
                                                          const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": cannot open '", path, "': ", std::strerror(errno)));
  }
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  absl::StatusOr<NpyHeader> header = ParseNpyHeader(bytes, path);
  if (!header.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", header.status().message()));
  }
  if (header->descr == "|O") {
    absl::StatusOr<std::vector<std::vector<int64_t>>> rows =
        ParseObjectArrayRows(header->data, header->shape, path);
    if (!rows.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": ", rows.status().message()));
    }
    return rows;
  }
  absl::StatusOr<v1::TensorData> t = ParseNpy(bytes, path);
  if (!t.ok()) return absl::InvalidArgumentError(absl::StrCat(flag, ": ", t.status().message()));
  if (t->shape_size() != 1 || (t->dtype() != "int64" && t->dtype() != "int32")) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": ", path, " is ", t->dtype(), " of ", t->shape_size(),
        " dimensions; a row of a ragged batch is a 1-D int32 or int64 array (or an object "
        "array holds the rows)"));
  }
  const int64_t n = t->shape(0);
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    if (t->dtype() == "int64") {
      std::memcpy(&out[i], t->data().data() + 8 * i, 8);
    } else {
      int32_t v;
      std::memcpy(&v, t->data().data() + 4 * i, 4);
      out[i] = v;
    }
  }
  return std::vector<std::vector<int64_t>>{std::move(out)};
}

// The rows of every file of a comma-separated list, in order; each row's origin for messages.
absl::Status ListRows(const std::string& files, const std::string& flag,
                      std::vector<std::vector<int64_t>>* rows, std::vector<std::string>* origins) {
  for (absl::string_view part : absl::StrSplit(files, ',', absl::SkipEmpty())) {
    const std::string path(part);
    absl::StatusOr<std::vector<std::vector<int64_t>>> file_rows = NpyRows(path, flag);
    if (!file_rows.ok()) return file_rows.status();
    for (size_t i = 0; i < file_rows->size(); ++i) {
      origins->push_back(file_rows->size() == 1 ? path : absl::StrCat(path, " row ", i));
      rows->push_back(std::move((*file_rows)[i]));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<RaggedRow>> ReadNpyRows(const std::string& inputs,
                                                   const std::string& targets, bool forward_only) {
  std::vector<std::vector<int64_t>> xs, ys;
  std::vector<std::string> x_origins, y_origins;
  RETURN_IF_ERROR(ListRows(inputs, "--inputs", &xs, &x_origins));
  if (!forward_only) {
    RETURN_IF_ERROR(ListRows(targets, "--targets", &ys, &y_origins));
    if (ys.size() != xs.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--targets: ", ys.size(), " rows for the ", xs.size(),
                       " rows of --inputs (one per row, in the same order)"));
    }
  }
  std::vector<RaggedRow> rows;
  for (size_t r = 0; r < xs.size(); ++r) {
    RaggedRow row;
    row.inputs = std::move(xs[r]);
    const bool bad_id =
        std::any_of(row.inputs.begin(), row.inputs.end(), [](int64_t v) { return v < 0; });
    if (row.inputs.empty() || bad_id) {
      return absl::InvalidArgumentError(
          absl::StrCat("--inputs: ", x_origins[r], ": a row needs 1 or more ids, each >= 0"));
    }
    if (!forward_only) {
      row.targets = std::move(ys[r]);
      if (row.targets.size() != row.inputs.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--targets: ", y_origins[r], " has ", row.targets.size(), " targets but its row ",
            x_origins[r], " has ", row.inputs.size(), " ids"));
      }
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

// `rows` of `values` padded with `pad` to `width`, as int64 [rows, width].
v1::TensorData PaddedRowsInt64(const std::vector<std::vector<int64_t>>& rows, int64_t width,
                               int64_t pad) {
  v1::TensorData t;
  t.set_dtype("int64");
  t.add_shape(static_cast<int64_t>(rows.size()));
  t.add_shape(width);
  std::string bytes(rows.size() * static_cast<size_t>(width) * 8, '\0');
  for (size_t r = 0; r < rows.size(); ++r) {
    for (int64_t c = 0; c < width; ++c) {
      const int64_t v = c < static_cast<int64_t>(rows[r].size()) ? rows[r][c] : pad;
      std::memcpy(&bytes[(r * width + c) * 8], &v, 8);
    }
  }
  t.set_data(std::move(bytes));
  return t;
}

}  // namespace

bool IsRaggedRows(const std::string& inputs) {
  if (absl::EndsWith(inputs, ".jsonl") || absl::StrContains(inputs, ',')) return true;
  // One .npy file: ragged rows when it is an object array.
  std::ifstream in(inputs, std::ios::binary);
  std::string head(4096, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  absl::StatusOr<NpyHeader> header = ParseNpyHeader(head, inputs);
  return header.ok() && header->descr == "|O";
}

absl::StatusOr<RaggedRows> ReadRaggedRows(const std::string& inputs, const std::string& targets,
                                          bool forward_only) {
  const bool jsonl = absl::EndsWith(inputs, ".jsonl");
  if (jsonl && !targets.empty()) {
    return absl::InvalidArgumentError(
        "--targets: not used with a .jsonl --inputs (its lines carry the targets)");
  }
  absl::StatusOr<std::vector<RaggedRow>> rows =
      jsonl ? ReadJsonlRows(inputs, forward_only) : ReadNpyRows(inputs, targets, forward_only);
  if (!rows.ok()) return rows.status();
  if (rows->empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--inputs: '", inputs, "' holds no row"));
  }
  RaggedRows out;
  std::vector<std::vector<int64_t>> x, y;
  int64_t width = 0;
  for (RaggedRow& row : *rows) {
    out.row_lengths.push_back(static_cast<int64_t>(row.inputs.size()));
    width = std::max(width, out.row_lengths.back());
    x.push_back(std::move(row.inputs));
    y.push_back(std::move(row.targets));
  }
  out.inputs = PaddedRowsInt64(x, width, 0);
  if (!forward_only) out.targets = PaddedRowsInt64(y, width, kIgnoredRowTarget);
  return out;
}

}  // namespace stagecoach::client
