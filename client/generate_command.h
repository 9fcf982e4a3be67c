// `stagectl generate JOB --prompt TEXT --vocab V [--tokens N] [--temperature T] [--top-k K]
// [--seed S] [--timeout D]`: text from a trained GPT job (GenerationService.Generate). The
// prompt is encoded with the character vocabulary the job's tokens were made with (`stagectl
// tokens build`), and each token the coordinator streams back is decoded and printed at once.
// Table output: the prompt, then the generated text as it comes, then a newline; the line
// "generated N tokens from JOB at step S (on HELPER)" goes to `err`. -o json|yaml: one document
// at the end, {job_id, ran_on_job, weights_step, prompt, tokens, text}.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

#include "client/commands.h"

namespace stagecoach::client {

struct GenerateOptions {
  std::string job_id;
  std::string prompt;      // --prompt, required, at least one character
  std::string vocab_path;  // --vocab, required
  int tokens = 200;
  double temperature = 0.8;  // 0: greedy
  int top_k = 0;             // 0: the whole vocabulary
  uint64_t seed = 0;
  std::string timeout = "10m";
};

// Runs the command against `client.coordinator`. 0 when every token came, 1 when the call
// failed (the coordinator's error, naming the field or the job's state), 2 for a usage error (a
// bad --timeout, --tokens < 1, an unreadable vocabulary, a prompt character it lacks).
int RunGenerate(const GenerateOptions& options, const ClientOptions& client, std::ostream& out,
                std::ostream& err);

}  // namespace stagecoach::client
