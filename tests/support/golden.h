// Reading files in tests, and the golden schedules captured from torch.distributed.pipelining
// (GoldenDir()). Failures are reported to the running gtest test as non-fatal failures, so these
// may only be called from inside a test.
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/schedule/action.h"
#include "common/schedule/generators.h"

namespace stagecoach::testing {

// The whole contents of the file at `path`, byte for byte. If it cannot be opened, adds a
// failure naming `path` and returns "".
std::string ReadFile(const std::string& path);

// The golden file `file` (a name inside GoldenDir()), as ReadFile reads it.
std::string ReadGolden(const std::string& file);

// `text` without any CR: PyTorch writes CRLF where we write LF.
std::string WithoutCR(std::string text);

// `text` without any CR and without trailing newlines: golden text files differ from ours only
// there.
std::string Normalized(std::string text);

// A golden schedule file, named `<schedule>_r<ranks>_s<stages_per_rank>_m<microbatches><suffix>`,
// e.g. "Interleaved1F1B_r4_s2_m8.compute.csv" (the suffix is everything from the first dot).
struct GoldenFile {
  std::string file;      // the file name inside GoldenDir()
  std::string base;      // `file` without its suffix: "Interleaved1F1B_r4_s2_m8"
  std::string schedule;  // the PyTorch schedule name: "Interleaved1F1B"
  int ranks = 0;
  int stages_per_rank = 0;
  int microbatches = 0;

  int num_stages() const { return ranks * stages_per_rank; }
};

// The golden schedule files whose suffix is exactly `suffix` (".compute.csv" matches
// "X.compute.csv", not "X.raw.compute.csv"), and, unless `schedule` is empty, whose schedule is
// exactly `schedule`. Sorted by file name; files not named as GoldenFile describes are skipped.
std::vector<GoldenFile> GoldenFiles(absl::string_view suffix, absl::string_view schedule = "");

// A generator config: `kind` on `ranks` ranks with `stages_per_rank` stages each, `microbatches`
// microbatches.
schedule::ScheduleConfig ScheduleConfigFor(schedule::ScheduleKind kind, int ranks,
                                           int stages_per_rank, int microbatches);

// "ZBVZeroBubble r4 s2 m8", for failure messages.
std::string DescribeConfig(const schedule::ScheduleConfig& config);

// Parses each string with schedule::ParseAction ("" is an idle slot); an invalid one adds a
// failure naming it and becomes an idle slot.
schedule::RankActions ParseActions(std::initializer_list<const char*> texts);

// One rank's actions as a CSV row: "0F0,,0B0" (idle slots empty).
std::string JoinActions(const schedule::RankActions& actions);

// The golden schedule CSV `file` (a name inside GoldenDir()), parsed with ParseScheduleCsv. If it
// cannot be read or parsed, adds a failure naming the file and the error and returns an empty
// order.
schedule::PipelineOrder LoadGoldenOrder(const std::string& file);

}  // namespace stagecoach::testing
