// One generation session through a PAUSED job's pipeline, with a key/value cache on every stage
// (WorkerService.Decode). The coordinator carries the activations: a decoding step sends the
// rows' new token ids to stage 0's worker, each stage's outputs to the next stage's worker, and
// takes the last stage's outputs at the last position, the next token's logits. Each stage's
// worker keeps, per session, its attention layers' keys and values, so a step of one new
// position per row costs one position through every stage.
//
// Rows are the session's prompts; a step runs some of them from where each one starts
// (worker/model/kv_cache.h): a prefill from position 0, or one new position after what the row
// holds. The session ends (its caches freed on every worker that held some) when the decoder is
// destroyed, however the generation ended; a worker that cannot be reached then frees them
// when the task ends or after its idle timeout.
//
// Not thread-safe: one generation's loop.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/job_manager.h"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::coordinator {

class PipelineDecoder {
 public:
  // WorkerService.Decode on the worker at an address, bounded by a timeout (JobManager::Decode).
  using DecodeCall = std::function<absl::StatusOr<v1::DecodeResponse>(
      const std::string& address, const v1::DecodeRequest& request, absl::Duration timeout)>;

  // `session` names the session on the workers (unique per generation); `rows` prompts of at
  // most `max_positions` positions; `vocab`: the logits' width.
  PipelineDecoder(DecodeCall decode, DecodeRoute route, std::string session, int64_t rows,
                  int64_t max_positions, int64_t vocab);
  ~PipelineDecoder();
  PipelineDecoder(const PipelineDecoder&) = delete;
  PipelineDecoder& operator=(const PipelineDecoder&) = delete;

  // Runs `tokens` (one list per row of `rows`, all of the same length T) through every stage,
  // row rows[j] from position starts[j]; returns the logits after each row's last token.
  // DEADLINE_EXCEEDED past `deadline`; a worker's error naming the job, stage and worker.
  absl::StatusOr<std::vector<std::vector<float>>> Step(
      const std::vector<int64_t>& rows, const std::vector<int64_t>& starts,
      const std::vector<std::vector<int32_t>>& tokens, absl::Time deadline);

  // Bytes of keys and values the workers held after the latest step (their sum).
  int64_t cache_bytes() const;

 private:
  const DecodeCall decode_;
  const DecodeRoute route_;
  const std::string session_;
  const int64_t rows_, max_positions_, vocab_;
  // By worker address: the cache bytes it reported last.
  std::map<std::string, int64_t> cache_bytes_;
};

// The token ids as TensorData int64 [rows, T] (every row of the same length).
v1::TensorData TokenRows(const std::vector<std::vector<int32_t>>& tokens);

// The logits of each row from the last stage's outputs float32 [rows, vocab]. INTERNAL naming
// `job_id` for another shape or dtype.
absl::StatusOr<std::vector<std::vector<float>>> RowLogits(const v1::TensorData& outputs,
                                                          int64_t rows, int64_t vocab,
                                                          const std::string& job_id);

}  // namespace stagecoach::coordinator
