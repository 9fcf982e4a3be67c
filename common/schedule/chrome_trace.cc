#include "common/schedule/chrome_trace.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace stagecoach::schedule {
namespace {

using nlohmann::json;

constexpr int kComputeTid = 0;
constexpr int kFirstCommTid = 1;

const char* Category(ActionType type) {
  switch (type) {
    case ActionType::kUnshard:
    case ActionType::kReshard:
      return "memory";
    case ActionType::kReduceGrad:
      return "gradient";
    case ActionType::kSendF:
    case ActionType::kRecvF:
    case ActionType::kSendB:
    case ActionType::kRecvB:
      return "communication";
    default:
      return "compute";
  }
}

json ActionArgs(const Action& action) {
  json args = {{"type", std::string(ActionTypeName(action.type))}};
  if (action.type == ActionType::kOverlapFB) {
    json subs = json::array();
    for (const Action& sub : action.sub_actions) subs.push_back(sub.ToString());
    args["sub_actions"] = std::move(subs);
    return args;
  }
  args["stage"] = action.stage;
  if (action.microbatch.has_value()) args["microbatch"] = *action.microbatch;
  return args;
}

// One side of a transfer on one rank's communication threads.
struct Transfer {
  double start;
  double end;
  size_t message;  // index into messages
  bool sender;
};

// A "communication" thread per lane so that complete events on each thread never overlap.
// Returns the lane of each transfer (ordered as `transfers`).
std::vector<int> AssignLanes(const std::vector<Transfer>& transfers) {
  std::vector<size_t> order(transfers.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::tie(transfers[a].start, transfers[a].end, transfers[a].message) <
           std::tie(transfers[b].start, transfers[b].end, transfers[b].message);
  });
  std::vector<double> lane_end;
  std::vector<int> lanes(transfers.size());
  for (size_t i : order) {
    size_t lane = 0;
    while (lane < lane_end.size() && lane_end[lane] > transfers[i].start) ++lane;
    if (lane == lane_end.size()) lane_end.push_back(0);
    lane_end[lane] = transfers[i].end;
    lanes[i] = static_cast<int>(lane);
  }
  return lanes;
}

class TraceBuilder {
 public:
  TraceBuilder(const std::vector<std::vector<TimedAction>>& timeline,
               const std::vector<Message>& messages, const ChromeTraceOptions& options)
      : timeline_(timeline),
        messages_(messages),
        options_(options),
        num_ranks_(static_cast<int>(timeline.size())),
        transfers_(timeline.size()),
        send_tid_(messages.size(), -1),
        recv_tid_(messages.size(), -1) {
    for (size_t i = 0; i < messages.size(); ++i) {
      const Message& m = messages[i];
      if (HasRank(m.from_rank)) transfers_[m.from_rank].push_back({m.start, m.arrive, i, true});
      if (HasRank(m.to_rank)) transfers_[m.to_rank].push_back({m.start, m.arrive, i, false});
    }
  }

  std::string Build() {
    for (int rank = 0; rank < num_ranks_; ++rank) {
      AddProcessMetadata(rank);
      AddRankActions(rank);
      const int lanes = AddTransfers(rank);
      for (int lane = 0; lane < std::max(lanes, 1); ++lane) AddCommThreadMetadata(rank, lane);
    }
    AddFlows();
    AddSpans();
    AddCounters();
    return absl::StrCat("{\"traceEvents\":[", events_, "],\"displayTimeUnit\":\"ms\",",
                        "\"otherData\":", OtherData().dump(), "}");
  }

 private:
  double Micros(double t) const { return t * options_.microseconds_per_unit; }

  bool HasRank(int rank) const { return rank >= 0 && rank < num_ranks_; }

  // Appends one event to the traceEvents array. Events are written as they are made rather than
  // kept as one document: traces of large schedules hold millions of them.
  void Emit(json event) {
    if (!options_.step_id.empty()) {
      const std::string ph = event.value("ph", "");
      if (ph != "M" && ph != "C") event["args"]["step_id"] = options_.step_id;
    }
    if (!events_.empty()) events_ += ',';
    events_ += event.dump();
  }

  void AddMetadata(const char* name, int pid, int tid, json args) {
    json event = {{"name", name}, {"ph", "M"}, {"pid", pid}, {"args", std::move(args)}};
    if (tid >= 0) event["tid"] = tid;
    Emit(event);
  }

  void AddProcessMetadata(int rank) {
    const bool named = rank < static_cast<int>(options_.process_names.size()) &&
                       !options_.process_names[rank].empty();
    AddMetadata("process_name", rank, -1,
                {{"name", named ? options_.process_names[rank] : absl::StrCat("Rank ", rank)}});
    AddMetadata("process_sort_index", rank, -1, {{"sort_index", rank}});
    AddMetadata("thread_name", rank, kComputeTid, {{"name", "compute"}});
    AddMetadata("thread_sort_index", rank, kComputeTid, {{"sort_index", kComputeTid}});
  }

  void AddCommThreadMetadata(int rank, int lane) {
    const int tid = kFirstCommTid + lane;
    const std::string name = lane == 0 ? "communication" : absl::StrCat("communication ", lane + 1);
    AddMetadata("thread_name", rank, tid, {{"name", name}});
    AddMetadata("thread_sort_index", rank, tid, {{"sort_index", tid}});
  }

  void AddComplete(const std::string& name, const char* cat, int pid, int tid, double start,
                   double end, json args) {
    Emit({{"name", name},
          {"cat", cat},
          {"ph", "X"},
          {"pid", pid},
          {"tid", tid},
          {"ts", Micros(start)},
          {"dur", Micros(end) - Micros(start)},
          {"args", std::move(args)}});
  }

  // Compute, memory and gradient actions on tid 0; SEND / RECV posts as instants on tid 1.
  void AddRankActions(int rank) {
    for (const TimedAction& timed : timeline_[rank]) {
      const Action& action = timed.action;
      end_ = std::max(end_, timed.end);
      if (!IsSendOrRecv(action.type)) {
        AddComplete(action.ToString(), Category(action.type), rank, kComputeTid, timed.start,
                    timed.end, ActionArgs(action));
        continue;
      }
      json args = ActionArgs(action);
      args["event"] = "post";
      Emit({{"name", action.ToString()},
            {"cat", "communication"},
            {"ph", "i"},
            {"s", "t"},
            {"pid", rank},
            {"tid", kFirstCommTid},
            {"ts", Micros(timed.start)},
            {"args", std::move(args)}});
    }
  }

  // The transfers `rank` sends or receives, one lane (thread) per set of non-overlapping ones.
  // Returns the number of lanes used.
  int AddTransfers(int rank) {
    const std::vector<Transfer>& transfers = transfers_[rank];
    const std::vector<int> lanes = AssignLanes(transfers);
    int num_lanes = 0;
    for (size_t k = 0; k < transfers.size(); ++k) {
      const Transfer& t = transfers[k];
      const Message& m = messages_[t.message];
      const int tid = kFirstCommTid + lanes[k];
      num_lanes = std::max(num_lanes, lanes[k] + 1);
      end_ = std::max(end_, t.end);
      const Action& own = t.sender ? m.send : m.recv;
      json args = ActionArgs(own);
      args["event"] = "transfer";
      args["peer_rank"] = t.sender ? m.to_rank : m.from_rank;
      args["bytes"] = m.bytes;
      AddComplete(own.ToString(), "communication", rank, tid, t.start, t.end, std::move(args));
      (t.sender ? send_tid_ : recv_tid_)[t.message] = tid;
    }
    return num_lanes;
  }

  // An arrow from each transfer's sender event to its receiver event, bound to the enclosing
  // slices at the transfer's midpoint.
  void AddFlows() {
    for (size_t i = 0; i < messages_.size(); ++i) {
      const Message& m = messages_[i];
      if (!HasRank(m.from_rank) || !HasRank(m.to_rank)) continue;
      const double ts = Micros(m.start) + (Micros(m.arrive) - Micros(m.start)) / 2;
      const std::string name = absl::StrCat(m.send.ToString(), " -> ", m.recv.ToString());
      Emit({{"name", name},
            {"cat", "communication"},
            {"ph", "s"},
            {"id", i},
            {"pid", m.from_rank},
            {"tid", send_tid_[i]},
            {"ts", ts}});
      Emit({{"name", name},
            {"cat", "communication"},
            {"ph", "f"},
            {"bp", "e"},
            {"id", i},
            {"pid", m.to_rank},
            {"tid", recv_tid_[i]},
            {"ts", ts}});
    }
  }

  // The extra track's spans (ChromeTraceOptions::spans), with its thread's name on each rank
  // that has one.
  void AddSpans() {
    constexpr int kFirstSpanTid = 1000;
    std::map<std::string, int> tids;      // track -> its thread
    std::set<std::pair<int, int>> named;  // (rank, thread)
    for (const TraceSpan& span : options_.spans) {
      if (!HasRank(span.rank)) continue;
      const std::string& track = span.track.empty() ? options_.span_track : span.track;
      const int tid =
          tids.emplace(track, kFirstSpanTid + static_cast<int>(tids.size())).first->second;
      if (named.insert({span.rank, tid}).second) {
        AddMetadata("thread_name", span.rank, tid, {{"name", track}});
        AddMetadata("thread_sort_index", span.rank, tid, {{"sort_index", tid}});
      }
      end_ = std::max(end_, span.end);
      AddComplete(span.name, "collective", span.rank, tid, span.start, span.end,
                  {{"bytes", span.bytes}});
    }
  }

  void AddCounters() {
    for (const TraceCounter& counter : options_.counters) {
      if (!HasRank(counter.rank)) continue;
      for (const auto& [time, value] : counter.points) {
        end_ = std::max(end_, time);
        Emit({{"name", counter.name},
              {"ph", "C"},
              {"pid", counter.rank},
              {"ts", Micros(time)},
              {"args", {{counter.series, value}}}});
      }
    }
  }

  json OtherData() const {
    json data = {{"microseconds_per_unit", options_.microseconds_per_unit},
                 {"num_ranks", num_ranks_},
                 {"end", end_}};
    if (!options_.title.empty()) data["title"] = options_.title;
    if (!options_.step_id.empty()) data["step_id"] = options_.step_id;
    return data;
  }

  const std::vector<std::vector<TimedAction>>& timeline_;
  const std::vector<Message>& messages_;
  const ChromeTraceOptions& options_;
  const int num_ranks_;
  std::vector<std::vector<Transfer>> transfers_;  // per rank: the transfers it takes part in
  std::vector<int> send_tid_;                     // per message: the sender's communication thread
  std::vector<int> recv_tid_;  // per message: the receiver's communication thread
  std::string events_;         // the traceEvents array's elements, comma-separated
  double end_ = 0;
};

}  // namespace

std::string FormatChromeTrace(const std::vector<std::vector<TimedAction>>& timeline,
                              const std::vector<Message>& messages,
                              const ChromeTraceOptions& options) {
  return TraceBuilder(timeline, messages, options).Build();
}

}  // namespace stagecoach::schedule
