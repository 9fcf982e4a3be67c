// stagecoach-sentencepiece as a child process of stagectl, for commands that need a
// SentencePiece model's ids and text without becoming the tool (`stagectl generate
// --tokenizer`): stagectl cannot load libsentencepiece itself (tokens_command.h says why).
// The tool's path: beside stagectl's executable, else on PATH.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace stagecoach::client {

// The tool's path: $STAGECOACH_SENTENCEPIECE_TOOL when set, else stagecoach-sentencepiece beside
// /proc/self/exe when it is there, else the bare name (looked up on PATH).
std::string SentencePieceToolPath();

// Runs the tool with `args` (after its name) and returns what it wrote on stdout. INTERNAL with
// its stderr when it exits non-zero or cannot be started; DEADLINE_EXCEEDED (the tool killed)
// after `timeout`.
absl::StatusOr<std::string> RunSentencePieceTool(const std::vector<std::string>& args,
                                                 absl::Duration timeout = absl::Seconds(60));

// `text`'s ids under the model at `tokenizer` (no BOS or EOS).
absl::StatusOr<std::vector<int32_t>> EncodeWithTokenizer(const std::string& tokenizer,
                                                         const std::string& text);

// `ids` as text under the model at `tokenizer` (each document up to an EOS decoded on its own).
absl::StatusOr<std::string> DecodeWithTokenizer(const std::string& tokenizer,
                                                const std::vector<int32_t>& ids);

}  // namespace stagecoach::client
