// Generation: autoregressive decoding from a trained built-in decoder job (gpt or llama) through
// its own pipeline (GenerationService.Generate in generation.proto; `stagectl generate`), with a
// key/value cache on every stage (pipeline_decoder.h): each prompt (row) runs through the stages
// once, then every new token runs one position; a TokenSampler per row picks the token from its
// logits. A row whose context outgrows the model's positions (a GPT's seq, a Llama's
// max_position_embeddings) runs its last that many tokens again from position 0 for each new
// token: the sliding window a plain model decodes with past its positions.
//
// The weights: a PAUSED job's current ones (it stays PAUSED, its timeline where it was), or a
// SUCCEEDED job's latest checkpoint, which a helper job loads: the job's spec with a
// ForwardOnly schedule and training.resume_from that checkpoint, submitted paused as
// "<name>-generate" and cancelled when the generation ends, however it ends. The workers'
// caches of the session are freed then too.
//
// Thread-safe (each call is independent; a task runs one decoding step at a time).
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
  // Most prompts (rows) one request may decode together.
  int64_t max_rows = 64;
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

  JobManager* const jobs_;
  const GenerationOptions options_;
};

}  // namespace stagecoach::coordinator
