// data.kind: jsonl — fine-tuning records: one JSON object per line with a prompt and a response
// string (data.fields: {prompt: K, response: K}, default "prompt" and "response"; other keys are
// ignored), tokenized with the SentencePiece model data.tokenizer. A record's tokens are BOS
// (when the model has one), the prompt's ids, the response's ids and EOS; the loss counts the
// positions whose target is a response token or the EOS, never the prompt's. Records become
// rows as documents do (document_rows.h: pad or pack, default pack).
//
// A record of more positions (tokens - 1) than the window seq is, by data.overlong: truncate
// (its first seq positions: the response may be cut), skip (left out) or fail (the job fails
// naming its line). How many were truncated and skipped is reported (JsonlRecords; the job's
// status shows them).
//
// The worker cannot load libsentencepiece (common/text/sentencepiece_tokenizer.h says why): it
// runs stagecoach-sentencepiece records (client/tokens/sentencepiece_records.h) as a child
// process, found at $STAGECOACH_SENTENCEPIECE_TOOL, else beside the worker's executable, else
// on PATH; the worker images install it beside stagecoach-worker. Its run has a deadline of a
// minute and a second per MB of records.
//
// Errors are INVALID_ARGUMENT naming the field and, for a record, data.path's line:
// "data.path: 'train.jsonl' line 3: no string \"response\"".
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "worker/runtime/data/document_rows.h"
#include "worker/runtime/data/training_data.h"

namespace stagecoach::runtime {

struct JsonlRecords {
  std::vector<int64_t> tokens;        // every kept record's tokens, one after another
  std::vector<uint8_t> counted;       // per token: whether predicting it counts in the loss
  std::vector<DocumentSpan> records;  // each kept record's [begin, end) of `tokens`
  int64_t eos = 0;
  int64_t read = 0, truncated = 0, skipped = 0;
};

// The records of `spec`'s data (kind jsonl) for windows of `seq` positions and a model of
// `vocab` tokens (0: any).
absl::StatusOr<JsonlRecords> ReadJsonlRecords(const spec::JobSpec& spec, int64_t seq,
                                              int64_t vocab);

// A BatchSource over `records` (BatchSource::Open's for kind jsonl).
std::unique_ptr<BatchSource> OpenJsonlSource(const spec::JobSpec& spec, JsonlRecords records,
                                             bool want_inputs, bool want_targets);

}  // namespace stagecoach::runtime
