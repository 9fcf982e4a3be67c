// Chrome trace (Trace Event Format) output for per-rank action timelines, as Perfetto
// (ui.perfetto.dev) and chrome://tracing open them. The timeline may come from Simulate or from
// timings measured at runtime. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/schedule/simulator.h"

namespace stagecoach::schedule {

// A span on a rank's extra track (ChromeTraceOptions::spans), in timeline units.
struct TraceSpan {
  int rank = 0;
  std::string name;
  double start = 0;
  double end = 0;
  int64_t bytes = 0;
  // The track it is drawn on; empty: ChromeTraceOptions::span_track. Each track is a thread of
  // its own (tid 1000, 1001, ... in the order the tracks first appear).
  std::string track;
};

// A counter drawn as a track of a rank's process (ph "C"), e.g. the memory model's live bytes.
struct TraceCounter {
  int rank = 0;
  std::string name;              // the track's name, e.g. "memory (predicted)"
  std::string series = "bytes";  // the value's name in each event's args
  // (time in timeline units, value) in time order; the value holds until the next point.
  std::vector<std::pair<double, double>> points;
};

struct ChromeTraceOptions {
  // Trace microseconds per timeline time unit (> 0). The default shows one simulator unit as
  // 1 ms; use 1e6 for timelines measured in seconds.
  double microseconds_per_unit = 1000;
  // Stored as otherData.title; left out when empty.
  std::string title;
  // When set, every event but metadata and counters carries args "step_id" with it, and
  // otherData "step_id": the events of one step from every rank share one id (a measured step's
  // "job-3/step-12"), so that traces merged or filtered elsewhere still line the step up.
  std::string step_id;
  // Process names by rank (row of the timeline); "Rank r" where empty or missing.
  std::vector<std::string> process_names;
  // Spans drawn on a track of their own per rank (tid 1000, named `span_track`), e.g. the
  // measured gradient reduction's buckets: complete events, cat "collective", args "bytes".
  std::vector<TraceSpan> spans;
  std::string span_track = "gradient reduction";
  // Counter tracks; one whose rank is not a row of the timeline adds nothing.
  std::vector<TraceCounter> counters;
};

// The trace as JSON text:
//   {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}
// with ts and dur in microseconds (timeline time * microseconds_per_unit). Rank r is process r
// ("process_name" "Rank r", "process_sort_index" r) with these threads:
//  - tid 0 "compute": one complete event (ph "X") per action of timeline[r] other than SEND and
//    RECV, from its start to its end; cat "compute" for F, I, B, W and OVERLAP_F_B, "memory" for
//    UNSHARD and RESHARD, "gradient" for REDUCE_GRAD.
//  - tid 1 "communication": an instant event (ph "i", at its start) per SEND and RECV of
//    timeline[r], and for each message sent or received by rank r a complete event from the
//    transfer's start to its arrival, named after the rank's own end (its SEND or RECV). Transfers
//    that overlap in time are spread over further threads "communication 2", "communication 3",
//    ... (tids 2, 3, ...), since complete events on one thread must nest.
//  - a flow (ph "s" on the sender, ph "f" with "bp": "e" on the receiver, both at the transfer's
//    midpoint, same id: the message's index in `messages`, named "0SEND_F0 -> 1RECV_F0") from
//    each transfer's sender event to its receiver event, which Perfetto draws as an arrow.
// Every other event's name is its action's string ("2F0", "1SEND_F0", "(0F3;3B1)OVERLAP_F_B") and
// its args hold "type" (e.g. "SEND_F") and, where the action has them, "stage" and "microbatch"
// (OVERLAP_F_B: "sub_actions"); posts add "event": "post", transfers "event": "transfer",
// "peer_rank" and "bytes". Output is compact (no whitespace); ~150 bytes per event.
// Each counter adds one event per point: {"name": name, "ph": "C", "pid": rank, "ts": ...,
// "args": {series: value}}.
// otherData holds "title" (if set), "microseconds_per_unit", "num_ranks" and "end" (the latest end
// in the timeline and the messages, in timeline units). Ranks are the rows of `timeline`; a
// message naming a rank beyond them adds no events for that rank.
std::string FormatChromeTrace(const std::vector<std::vector<TimedAction>>& timeline,
                              const std::vector<Message>& messages,
                              const ChromeTraceOptions& options = {});

}  // namespace stagecoach::schedule
