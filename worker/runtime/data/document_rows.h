// Rows of whole documents from a token file (data.kind: tokens with data.packing), instead of
// random windows: real text is ragged, and a window that starts mid-document or runs across two
// of them teaches the model to continue one document with another.
//
// Documents: the token stream cut after every EOS id (data.eos); a document is its tokens up to
// and including its EOS (a tail without one at the file's end is a document too). A document of
// n tokens gives n - 1 positions (inputs its first n - 1 tokens, targets its last n - 1, the
// EOS the last target); documents of fewer than two tokens give none and are left out.
//
// Step k's batch of B rows of at most T = seq positions, drawn from generator(seed + 1 + k):
//   pad   first = randint(0, D, [B]); row i is document first[i], cut to its first T positions.
//   pack  first = randint(0, D, [B]); row i starts with document first[i] and goes on with the
//         documents after it in file order (wrapping around, each at most once), each whole,
//         while they fit in T positions; a first document of more than T positions is cut to T.
// Tensors are [B, T]: inputs padded with the EOS id, targets with kIgnoredTarget; row_lengths
// [B] the positions each row holds (>= 1); with pack, segments [B, T] the index within its row
// of each position's document (0, 1, ...), -1 on padding.
//
// A microbatch runs padded to its own longest row, not to T (TrimToLongestRow): the pipeline's
// shapes then vary per microbatch (ExecutorOptions::dynamic_shapes), never beyond [rows, T].
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "worker/runtime/data/training_data.h"

namespace stagecoach::runtime {

// The documents of `tokens`, each as [begin, end) into it, those of two or more tokens only.
struct DocumentSpan {
  int64_t begin = 0;
  int64_t end = 0;
};
std::vector<DocumentSpan> SplitDocuments(const std::vector<int64_t>& tokens, int64_t eos);

// The batch of `step` from `documents` of `tokens` (the file comment); `pack` or pad. With
// `counted` (one flag per token), a target position counts only where its target token's flag
// is set (fine-tuning records: the response's tokens), else it is kIgnoredTarget.
Batch DocumentRows(const std::vector<int64_t>& tokens, const std::vector<DocumentSpan>& documents,
                   int64_t eos, bool pack, int64_t rows, int64_t seq, uint64_t seed, int64_t step,
                   const std::vector<uint8_t>* counted = nullptr);

// A source of document rows over a token file's `tokens` (read and checked by the caller):
// INVALID_ARGUMENT naming data.path when no document has two or more tokens.
absl::StatusOr<std::unique_ptr<BatchSource>> OpenDocumentSource(const spec::JobSpec& spec,
                                                                std::vector<int64_t> tokens,
                                                                int64_t eos, bool want_inputs,
                                                                bool want_targets);

// Documents given as they are (fine-tuning records, jsonl_records.h): `documents` of `tokens`,
// `counted` one flag per token (empty: every target counts), `pad` the padding input.
// `records` is what the source's records() says.
std::unique_ptr<BatchSource> MakeDocumentSource(const spec::JobSpec& spec,
                                                std::vector<int64_t> tokens,
                                                std::vector<DocumentSpan> documents,
                                                std::vector<uint8_t> counted, int64_t pad,
                                                bool want_inputs, bool want_targets,
                                                BatchSource::Records records = {});

// `microbatch` ([rows, T, ...]) cut to its rows' longest length: the first max(lengths) columns
// of dimension 1. `lengths` are the microbatch's rows' row_lengths.
torch::Tensor TrimToLongestRow(const torch::Tensor& microbatch, const torch::Tensor& lengths);
// The same cut to `width` columns, for several tensors of one microbatch (LongestRow once).
int64_t LongestRow(const torch::Tensor& lengths);
torch::Tensor TrimToWidth(const torch::Tensor& microbatch, int64_t width);

// Cuts microbatch mb of every part (inputs, targets, segments: empty ones are left alone) to
// the longest of `lengths[mb]` (`each`), or all of them to the longest row of all `lengths`
// (when the pipeline's shapes must not vary per microbatch). Widths are found once.
void CutToLongestRows(const std::vector<torch::Tensor>& lengths, bool each,
                      std::initializer_list<std::vector<torch::Tensor>*> parts);

}  // namespace stagecoach::runtime
