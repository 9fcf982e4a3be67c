// `stagectl generate JOB (--prompt TEXT | --prompt-ids "ID ...")... [--vocab V | --tokenizer M]
// [--tokens N] [--temperature T] [--top-k K] [--seed S] [--timeout D]`: text from a trained
// decoder job, built-in gpt or llama (GenerationService.Generate, decoding through the job's
// pipeline with a key/value cache on every stage). Each --prompt (or --prompt-ids) is one row;
// several decode together.
//
// Tokenizers: --vocab, the character vocabulary the job's tokens were made with (`stagectl
// tokens build`); --tokenizer, a SentencePiece model (run through stagecoach-sentencepiece,
// tokens/sentencepiece_process.h); neither, for a job whose model is model.hf: DIR/tokenizer.model
// when that file is there. --prompt-ids takes and prints token ids, for tokenizers Stagecoach
// does not carry (the client decodes with its own library); a tokenizer then only adds the text.
//
// Table output: with one prompt and a character vocabulary, the prompt and then the text as it
// comes; otherwise each row's prompt and text (or ids) once generation ends. The line
// "generated N tokens from JOB at step S (on HELPER)" goes to `err`. -o json|yaml: one document
// at the end, {job_id, ran_on_job, weights_step, rows: [{prompt, prompt_ids, tokens, text}]},
// with the first row's prompt, tokens and text also at the top level.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "client/commands.h"

namespace stagecoach::client {

struct GenerateOptions {
  std::string job_id;
  std::vector<std::string> prompts;     // --prompt, each at least one character
  std::vector<std::string> prompt_ids;  // --prompt-ids, each ids separated by spaces
  std::string vocab_path;               // --vocab
  std::string tokenizer_path;           // --tokenizer
  int tokens = 200;
  double temperature = 0.8;  // 0: greedy
  int top_k = 0;             // 0: the whole vocabulary
  uint64_t seed = 0;
  std::string timeout = "10m";
};

// Runs the command against `client.coordinator`. 0 when every token came, 1 when the call
// failed (the coordinator's error, naming the field or the job's state) or the tokenizer did,
// 2 for a usage error (a bad --timeout, --tokens < 1, no prompt or both kinds, ids that are not
// integers, an unreadable vocabulary, a prompt character it lacks, no tokenizer for --prompt).
int RunGenerate(const GenerateOptions& options, const ClientOptions& client, std::ostream& out,
                std::ostream& err);

}  // namespace stagecoach::client
