// stagecoach-sentencepiece, what `stagectl tokens` becomes with a SentencePiece model
// (common/text/sentencepiece_tokenizer.h; tokens_command.h says why it is a tool of its own):
//   train TEXT... --vocab-size N --out tokenizer.model
//                              a BPE model of N pieces trained on the files
//   build TEXT... --tokenizer M --out T [--dtype uint16|uint32]
//                              each file a document: its ids, then the tokenizer's EOS; the
//                              token file data.kind tokens reads (data.dtype)
//   encode TEXT... | --text S --tokenizer M [--bos] [--eos] [--out T] [--dtype D]
//                              ids (space-separated on stdout, or the token file T), BOS/EOS
//                              only when asked
//   decode T --tokenizer M [--dtype D] [--out FILE]
//                              a token file back to text, each document (up to an EOS) decoded
//                              on its own, so that build's files give their text back exactly
//   records FILE.jsonl --tokenizer M [--prompt-field K] [--response-field K]
//                              fine-tuning records' ids, for the worker (sentencepiece_records.h)
#pragma once

#include <iosfwd>

#include "client/tokens/tokens_options.h"

namespace stagecoach::client {

// Results to `out` (or the --out file), errors to `err`: 0 on success, 1 for an error in a file
// (or text) it reads or writes, 2 for a usage error, 3 when the tokenizer (--tokenizer) cannot
// be loaded. Files are written to a temporary name, synced, then
// renamed into place.
int RunSentencePieceTokens(const TokensCommandOptions& options, std::ostream& out,
                           std::ostream& err);

}  // namespace stagecoach::client
