// Checked 64-bit arithmetic for sizes computed from user input (spec fields, parameter counts):
// an overflow is reported, never wrapped into a negative or small count.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>

namespace stagecoach {

// *out = a * b + c; false (and *out unspecified) when it does not fit in int64_t.
inline bool CheckedMulAdd(int64_t a, int64_t b, int64_t c, int64_t* out) {
  int64_t product = 0;
  return !__builtin_mul_overflow(a, b, &product) && !__builtin_add_overflow(product, c, out);
}

}  // namespace stagecoach
