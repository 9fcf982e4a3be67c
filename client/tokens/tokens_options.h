// The options of `stagectl tokens` (tokens_command.h) and of stagecoach-sentencepiece
// (sentencepiece_tokens.h), which share them. Plain data; no dependencies beyond the standard
// library, so that the SentencePiece tool links nothing of stagectl's.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace stagecoach::client {

struct TokensCommandOptions {
  std::string action;               // build, encode or decode
  std::vector<std::string> inputs;  // text files (build, encode) or one token file (decode)
  std::optional<std::string> text;  // encode: this text instead of files
  std::string vocab_path;
  std::string out_path;  // required for build
  // SentencePiece (sentencepiece_tokens.h): the model file (written by train, read by the rest),
  // train's vocabulary size, encode's BOS/EOS, and the token files' dtype.
  std::string tokenizer_path;
  int vocab_size = 0;
  bool bos = false;
  bool eos = false;
  std::string dtype = "uint16";
  // records (sentencepiece_records.h): the keys of each record's prompt and response.
  std::string prompt_field = "prompt";
  std::string response_field = "response";
};

}  // namespace stagecoach::client
