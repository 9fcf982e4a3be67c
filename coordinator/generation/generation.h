// Generation: autoregressive decoding from a trained built-in GPT job through its own pipeline
// (GenerationService.Generate in generation.proto; `stagectl generate`). Each new token is one
// forward-only client step (JobManager::StepJob with forward_only) on the last
// model.builtin.seq tokens of the prompt and the tokens made so far, each row of the batch the
// same window (a step needs a row per microbatch; row 0's last position is used); a
// TokenSampler picks the token from its logits. Causal attention makes the logits at the last
// position those of the window alone, so this is the decoding a plain model does.
//
// The weights: a PAUSED job's current ones (it stays PAUSED, its timeline where it was), or a
// SUCCEEDED job's latest checkpoint, which a helper job loads: the job's spec with a
// ForwardOnly schedule and training.resume_from that checkpoint, submitted paused as
// "<name>-generate" and cancelled when the generation ends, however it ends.
//
// Thread-safe (each call is independent; the job manager serialises steps per job).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/job_manager.h"
#include "stagecoach/v1/generation.pb.h"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::coordinator {

struct GenerationOptions {
  // How often the start of a helper job is checked.
  absl::Duration poll_interval = absl::Milliseconds(100);
  // Most tokens one request may ask for.
  int max_tokens = 100000;
};

class Generation {
 public:
  // `jobs` must outlive this.
  explicit Generation(JobManager* jobs, GenerationOptions options = {});

  // Runs `request` within `timeout`, calling `emit` with each message to stream (the first
  // also names the job that ran it and the weights' step); `emit` returning false means the
  // caller went away (CANCELLED). `caller_gone` (optional) is polled while waiting. Errors as
  // GenerationService.Generate documents them.
  absl::Status Generate(const v1::GenerateRequest& request, absl::Duration timeout,
                        const std::function<bool()>& caller_gone,
                        const std::function<bool(const v1::GenerateResponse&)>& emit);

 private:
  struct Target;
  // The job the steps run on: `job` itself when PAUSED, else a helper job from its latest
  // checkpoint (SUCCEEDED), started and PAUSED before `deadline`.
  absl::StatusOr<Target> ResolveTarget(const v1::Job& job, absl::Time deadline,
                                       const std::function<bool()>& caller_gone);
  absl::StatusOr<Target> StartHelper(const v1::Job& job, absl::Time deadline,
                                     const std::function<bool()>& caller_gone);
  // The logits of the next token after `window` (row 0, last position).
  absl::StatusOr<std::vector<float>> NextLogits(const Target& target,
                                                const std::vector<int32_t>& window,
                                                absl::Time deadline,
                                                const std::function<bool()>& caller_gone,
                                                int64_t vocab);

  JobManager* const jobs_;
  const GenerationOptions options_;
};

// The last-position logits of row 0 of a forward step's outputs, which must be
// [rows, window, vocab] float32 or float64. INTERNAL naming `job_id` otherwise.
absl::StatusOr<std::vector<float>> LastPositionLogits(const v1::TensorData& outputs, int64_t window,
                                                      int64_t vocab, const std::string& job_id);

// The TensorData int64 [rows, window.size()] with `window` in every row.
v1::TensorData WindowRows(const std::vector<int32_t>& window, int64_t rows);

}  // namespace stagecoach::coordinator
