// stagecoach-sentencepiece records: fine-tuning records (JSON Lines, one object per line with a
// prompt and a response string) tokenized for the worker's data.kind jsonl
// (worker/runtime/data/jsonl_records.h), which runs the tool because it cannot load
// libsentencepiece itself (common/text/sentencepiece_tokenizer.h says why).
//
//   records FILE --tokenizer M [--prompt-field K] [--response-field K]
//
// Prints on stdout, first the tokenizer's line, then one line per record (blank lines are no
// record; keys other than the two fields are ignored):
//   tokenizer <vocab size> <bos id> <eos id>        (-1 for a piece the model lacks)
//   <line number>\t<the prompt's ids>\t<the response's ids>    (ids space-separated, no BOS/EOS)
// What a record becomes (BOS, EOS, which targets count, overlong records) is the worker's.
// A line that is not a JSON object, or lacks a field's string, fails naming the file and line:
// "'train.jsonl' line 3: no string \"response\"".
#pragma once

#include <iosfwd>

#include "absl/status/status.h"
#include "client/tokens/tokens_options.h"
#include "common/text/sentencepiece_tokenizer.h"

namespace stagecoach::client {

absl::Status WriteRecordIds(const TokensCommandOptions& options,
                            const text::SentencePieceTokenizer& tokenizer, std::ostream& out);

}  // namespace stagecoach::client
