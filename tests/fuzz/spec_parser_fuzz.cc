// libFuzzer target: ParseJobSpec (common/spec/spec_parser.h), the YAML job spec a client
// submits, on arbitrary bytes. Errors are expected; a crash, a sanitizer report, an uncaught
// exception or a malloc past libFuzzer's -malloc_limit_mb is a bug.
// Seeds: tests/fuzz/corpus/spec_parser (configs/*.yaml and a few hand-written specs).
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "common/spec/spec_parser.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  (void)stagecoach::spec::ParseJobSpec(text, "fuzz.yaml");
  return 0;
}
