// libFuzzer target: LoadScheduleCsv (common/schedule/csv.h) on arbitrary bytes, in both formats,
// with and without backward; the reading, the limits (CsvLimits), the validator and the lowering
// it runs. Also checks that a file ParseScheduleCsv reads is written back (FormatScheduleCsv) to
// text that reads to the same rows. A crash, a sanitizer report or a malloc past libFuzzer's
// -malloc_limit_mb is a bug. Seeds: tests/fuzz/corpus/schedule_csv (PyTorch's golden files).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"
#include "common/schedule/csv.h"

namespace sched = stagecoach::schedule;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  for (sched::CsvFormat format :
       {sched::CsvFormat::kComputeOnly, sched::CsvFormat::kComputeComms}) {
    for (bool has_backward : {true, false}) {
      sched::CsvLoadOptions options;
      options.has_backward = has_backward;
      options.source = "fuzz.csv";
      (void)sched::LoadScheduleCsv(text, format, options);
    }
  }
  auto rows = sched::ParseScheduleCsv(text);
  if (rows.ok()) {
    const std::string written = sched::FormatScheduleCsv(*rows);
    auto again = sched::ParseScheduleCsv(written);
    if (!again.ok() || *again != *rows) std::abort();  // the writer and reader disagree
  }
  return 0;
}
