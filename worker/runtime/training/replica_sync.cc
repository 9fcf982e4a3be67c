#include "worker/runtime/training/replica_sync.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/util/status_macros.h"
#include "worker/runtime/checkpoint/checkpoint.h"
#include "worker/runtime/checkpoint/state_file.h"
#include "worker/runtime/executor/side_effect_guard.h"

namespace stagecoach::runtime {
namespace {

// Broadcasts `bytes` from `donor` (its own on the donor, replaced on the others).
absl::Status BroadcastBytes(collectives::Collectives& group, int donor, std::vector<char>& bytes,
                            absl::Duration timeout, const std::string& what) {
  double length = static_cast<double>(bytes.size());
  absl::Status sent = group.Broadcast(&length, 1, collectives::DataType::kFloat64, donor, timeout);
  if (!sent.ok()) {
    return absl::Status(sent.code(), absl::StrCat(what, ": its length: ", sent.message()));
  }
  const size_t size = static_cast<size_t>(length);
  std::vector<float> words((size + sizeof(float) - 1) / sizeof(float), 0.0f);
  if (group.rank() == donor && size > 0) std::memcpy(words.data(), bytes.data(), size);
  sent = group.Broadcast(words.data(), static_cast<int64_t>(words.size()),
                         collectives::DataType::kFloat32, donor, timeout);
  if (!sent.ok()) return absl::Status(sent.code(), absl::StrCat(what, ": ", sent.message()));
  if (group.rank() != donor) {
    bytes.resize(size);
    if (size > 0) std::memcpy(bytes.data(), words.data(), size);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SyncStats> SyncReplicaState(collectives::Collectives& group, int donor,
                                           const std::map<int, model::StageModel*>& stages,
                                           torch::optim::Optimizer& optimizer,
                                           const torch::Device& device, int64_t global_step,
                                           absl::Duration timeout) {
  const absl::Time start = absl::Now();
  SyncStats stats;
  const bool donating = group.rank() == donor;
  for (const auto& [index, stage] : stages) {
    const std::string what = absl::StrCat("stage ", index, "'s state from group rank ", donor);
    std::vector<char> bytes;
    if (donating) {
      ASSIGN_OR_RETURN(StateSnapshot snapshot,
                       SnapshotState(index, global_step, "", false, stage->NamedParameters(),
                                     stage->NamedBuffers(), optimizer, global_step));
      ASSIGN_OR_RETURN(bytes, PickleSnapshot(snapshot));
    }
    RETURN_IF_ERROR(BroadcastBytes(group, donor, bytes, timeout, what));
    stats.bytes += static_cast<int64_t>(bytes.size());
    if (donating) continue;
    ASSIGN_OR_RETURN(SavedState saved, ParseStateBytes(bytes, what));
    RETURN_IF_ERROR(RestoreSavedState(std::move(saved), what, stage->NamedParameters(), &optimizer,
                                      stage->NamedBuffers()));
  }
  // The generator: dropout must draw the same on every replica.
  std::vector<char> rng;
  if (donating) {
    const torch::Tensor state = RngState(device).contiguous().to(torch::kCPU);
    rng.resize(static_cast<size_t>(state.numel() * state.element_size()));
    std::memcpy(rng.data(), state.data_ptr(), rng.size());
  }
  RETURN_IF_ERROR(BroadcastBytes(group, donor, rng, timeout, "the random generator's state"));
  if (!donating) {
    torch::Tensor state = torch::empty({static_cast<int64_t>(rng.size())}, torch::kUInt8);
    std::memcpy(state.data_ptr(), rng.data(), rng.size());
    SetRngState(device, state);
  }
  stats.took = absl::Now() - start;
  return stats;
}

}  // namespace stagecoach::runtime
