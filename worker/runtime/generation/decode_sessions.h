// The generation sessions of one task (WorkerService.Decode): for each session and each of the
// task's stages it runs, the stage's key/value caches (worker/model/kv_cache.h) and how many
// positions each row holds, so that a session's next positions run through the stage against
// what the earlier ones left.
//
// A session is created by its first request, which fixes its rows and max positions; later
// requests must repeat them. A request's rows must be distinct and below the session's rows,
// its starts at most what each row holds on that stage (a row is cut back to its start), and
// start + T at most max positions. A stage whose model is not a chain of built-in layers
// (worker/model/layer_chain.h) is refused (FAILED_PRECONDITION). Sessions end with End, with
// Clear (the task's end), or when unused for longer than the idle timeout (dropped at the next
// request of any session).
//
// Thread-safe; Run computes under the object's lock (one decoding step at a time per task,
// which the step gate serialises anyway).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/model/kv_cache.h"
#include "worker/model/precision.h"
#include "worker/model/stage_model.h"

namespace stagecoach::runtime {

// One decoding step of one stage.
struct DecodeStepRequest {
  std::string session;
  int stage = 0;
  int64_t session_rows = 1;
  int64_t max_positions = 1;
  std::vector<int64_t> rows;
  std::vector<int64_t> starts;
  // Stage 0: int64 token ids [n, T]; later stages: the previous stage's outputs [n, T, ...].
  torch::Tensor inputs;
  // Keep only the last position of the outputs.
  bool last_position_only = false;
};

struct DecodeStepResult {
  // float32, on the CPU.
  torch::Tensor outputs;
  // Bytes of caches this task holds for the session (all stages) afterwards.
  int64_t cache_bytes = 0;
};

class DecodeSessions {
 public:
  // The most rows a session may have.
  static constexpr int64_t kMaxRows = 256;

  explicit DecodeSessions(absl::Duration idle_timeout = absl::Minutes(10))
      : idle_timeout_(idle_timeout) {}

  // Runs `request` on `stage` (no autograd; autocast per `precision`; on `device`).
  // INVALID_ARGUMENT naming the field (session_rows, max_positions, rows, starts, inputs) for a
  // request that does not fit the session or the stage; FAILED_PRECONDITION for a stage that is
  // not a built-in decoder's.
  absl::StatusOr<DecodeStepResult> Run(const DecodeStepRequest& request, model::StageModel& stage,
                                       model::Precision precision, const torch::Device& device);

  // Frees `session`'s caches (a no-op for a session it does not hold).
  void End(const std::string& session);
  // Frees every session's caches.
  void Clear();

  // Sessions held, and the bytes of all their caches.
  int64_t sessions() const;
  int64_t cache_bytes() const;

 private:
  struct Session {
    int64_t rows = 1;
    int64_t max_positions = 1;
    absl::Time last_used;
    // By stage: its caches, and the positions each row holds there.
    std::map<int, model::StageKv> caches;
    std::map<int, std::vector<int64_t>> held;
    int64_t Bytes() const;
  };

  // The session's state for `request`, made at its first request; the errors of a request
  // that does not fit it.
  absl::StatusOr<Session*> SessionFor(const DecodeStepRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration idle_timeout_;
  mutable absl::Mutex mu_;
  std::map<std::string, Session> sessions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stagecoach::runtime
