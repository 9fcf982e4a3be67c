// A RendezvousStore in a directory, for ranks that are separate processes of one machine.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/transport/rendezvous_store.h"

namespace stagecoach::testing {

// Each key is a file in `dir` (named by the key's hex encoding). Set writes a temporary file
// and renames it into place, so readers see a value whole or not at all. Get and Wait poll
// every millisecond. Thread-safe and process-safe; `dir` must exist.
class FileRendezvousStore final : public transport::RendezvousStore {
 public:
  explicit FileRendezvousStore(std::string dir);

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;

 private:
  std::string PathOf(const std::string& key) const;

  const std::string dir_;
};

}  // namespace stagecoach::testing
