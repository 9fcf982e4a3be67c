// SHA-256 digests, as lowercase hex, of uploads (the artifact store) and checkpoint files.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stagecoach {

// Incremental SHA-256. Not thread-safe.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(absl::string_view bytes);
  // The digest of everything passed to Update, as 64 lowercase hex digits. Call once.
  std::string FinalHex();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// SHA-256 of `bytes`, as 64 lowercase hex digits.
std::string Sha256Hex(absl::string_view bytes);

// SHA-256 of a file's contents. NOT_FOUND when it cannot be opened, DATA_LOSS on a read error.
absl::StatusOr<std::string> Sha256OfFile(const std::string& path);

// Whether `s` looks like a digest FinalHex returns (64 lowercase hex digits).
bool IsSha256Hex(absl::string_view s);

}  // namespace stagecoach
