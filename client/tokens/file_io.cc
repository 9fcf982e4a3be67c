#include "client/tokens/file_io.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/util/durable_file.h"

namespace stagecoach::client {

absl::StatusOr<std::string> ReadWholeFile(const std::string& path, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", what, " ", path));
  std::stringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("reading ", what, " ", path, " failed"));
  return bytes.str();
}

absl::Status WriteWholeFile(const std::string& path, absl::string_view contents,
                            absl::string_view what) {
  DurableFileOptions options;
  options.what = std::string(what);
  return WriteFileDurably(path, contents, options);
}

}  // namespace stagecoach::client
