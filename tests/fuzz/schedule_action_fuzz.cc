// libFuzzer target: ParseAction (common/schedule/action.h) on arbitrary bytes. An action it
// accepts must print (Action::ToString) to text that parses back to the same action. A crash,
// a sanitizer report or a disagreement is a bug. Seeds: tests/fuzz/corpus/schedule_action.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "common/schedule/action.h"

namespace sched = stagecoach::schedule;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  auto action = sched::ParseAction(text);
  if (!action.ok() || !action->has_value()) return 0;
  auto again = sched::ParseAction((*action)->ToString());
  if (!again.ok() || !again->has_value() || **again != **action) std::abort();
  return 0;
}
