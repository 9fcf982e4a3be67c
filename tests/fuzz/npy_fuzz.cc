// libFuzzer target: ParseNpy (client/npy.h), the .npy reader stagectl uses for user tensors, on
// arbitrary bytes; a tensor it accepts is written back with SerializeNpy. Errors are expected; a
// crash, a sanitizer report or a malloc past libFuzzer's -malloc_limit_mb is a bug.
// Seeds: tests/fuzz/corpus/npy (written by tests/fuzz/make_npy_seeds.py).
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "client/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto tensor = stagecoach::client::ParseNpy(bytes, "fuzz.npy");
  if (tensor.ok()) (void)stagecoach::client::SerializeNpy(*tensor);
  return 0;
}
