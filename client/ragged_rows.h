// Client batches of ragged rows for `stagectl step` (StepJobRequest.row_lengths): rows of token
// ids of different lengths, padded here to the longest and sent with each row's length, so that
// the job runs each microbatch cut to its own longest row and counts only real targets.
//
// --inputs takes, instead of one .npy file:
//   - a JSON Lines file (*.jsonl), one row per non-blank line: a JSON array of token ids (a
//     document: a training step predicts each next id, so inputs are its ids but the last and
//     targets its ids but the first; a forward-only step takes all of them), or an object
//     {"inputs": [...], "targets": [...]} of two equally long arrays (targets -100 are ignored;
//     a forward-only step needs only "inputs"). --targets is not used.
//   - .npy files: one, or a comma-separated list (a.npy,b.npy,...), each a row (a 1-D int32 or
//     int64 array) or many (an object array of such arrays or of lists of integers, as
//     np.save writes np.array([...], dtype=object): npy_object_rows.h); --targets then names
//     .npy files holding as many rows, in the same order, each as long as its input row.
// Inputs are padded with id 0 and targets with -100 (ignored). Ids are integers >= 0, targets
// >= 0 or -100. Errors are INVALID_ARGUMENT naming the flag, the file and the line or row.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::client {

struct RaggedRows {
  v1::TensorData inputs;   // int64 [rows, longest]
  v1::TensorData targets;  // int64 [rows, longest]; empty for a forward-only step
  std::vector<int64_t> row_lengths;
};

// Whether --inputs names ragged rows (a .jsonl file, a list of .npy files, or one .npy file
// that is an object array) rather than one .npy batch.
bool IsRaggedRows(const std::string& inputs);

// The ragged rows of --inputs (and, for .npy rows, --targets) for a training or forward-only
// step.
absl::StatusOr<RaggedRows> ReadRaggedRows(const std::string& inputs, const std::string& targets,
                                          bool forward_only);

}  // namespace stagecoach::client
