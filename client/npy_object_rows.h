// Ragged rows from a NumPy object array: what `np.save("rows.npy", np.array([np.array([...]),
// ...], dtype=object))` writes (dtype '|O': the array is pickled after the header). stagectl
// step takes it as a client batch of ragged rows (ragged_rows.h).
//
// The pickle is read by a restricted unpickler that runs nothing: it understands the opcodes
// numpy's pickles of arrays use (protocols 2 to 5) and builds only what they describe — None,
// booleans, integers, strings, bytes, tuples, lists, and numpy arrays and dtypes made by
// numpy's _reconstruct and numpy.dtype; any other global, or any other opcode, is refused
// naming it. The array must be 1-D; each element a 1-D little-endian int32 or int64 array, or a
// list of integers. Errors are INVALID_ARGUMENT naming the file and, for an element, its index.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stagecoach::client {

// The rows of the object array whose pickle is `pickle` (the data after an .npy header of
// shape `shape`); `name` starts every error message.
absl::StatusOr<std::vector<std::vector<int64_t>>> ParseObjectArrayRows(
    absl::string_view pickle, const std::vector<int64_t>& shape, absl::string_view name);

}  // namespace stagecoach::client
