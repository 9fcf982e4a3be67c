// libFuzzer target: ParseSafetensors (common/safetensors/format.h), the check of a safetensors
// file's header that every model a user hands us goes through, on arbitrary bytes. A header it
// accepts must describe tensors that lie inside the data section, end to end: the target checks
// that, and that every tensor's bytes are its shape's. Errors are expected; a crash, a sanitizer
// report or a malloc past libFuzzer's -malloc_limit_mb is a bug.
// Seeds: tests/fuzz/corpus/safetensors_header (written by tests/support/safetensors_ref.py).
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "common/safetensors/format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto header = stagecoach::safetensors::ParseSafetensors(bytes, "fuzz.safetensors");
  if (!header.ok()) return 0;
  uint64_t covered = 0;
  for (const stagecoach::safetensors::TensorInfo& t : header->tensors) {
    const uint64_t want = static_cast<uint64_t>(t.NumElements()) *
                          static_cast<uint64_t>(stagecoach::safetensors::ElementSize(t.dtype));
    if (t.begin != covered || t.end < t.begin || t.NumBytes() != want) std::abort();
    covered = t.end;
  }
  if (covered != header->data_size || header->data_start + header->data_size != size) std::abort();
  return 0;
}
