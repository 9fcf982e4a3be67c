// The measured step trace and its per-job store (see step_trace.h).
#include "coordinator/jobs/step_trace.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/rpc/time_conversion.h"
#include "common/schedule/action.h"
#include "common/schedule/chrome_trace.h"
#include "common/schedule/simulator.h"
#include "common/util/status_macros.h"

namespace stagecoach::coordinator {
namespace {

using schedule::Action;
using schedule::ActionType;

// Identifies one transfer: replica, direction (true = backward), sending stage, microbatch.
using MessageKey = std::tuple<int, bool, int, int>;

// Where an action sits: timeline[rank][index].
struct Place {
  int rank = 0;
  size_t index = 0;
};

// The message a SEND or RECV takes part in.
MessageKey KeyOf(int replica, const Action& a) {
  const int mb = *a.microbatch;
  switch (a.type) {
    case ActionType::kSendF:
      return {replica, false, a.stage, mb};
    case ActionType::kRecvF:
      return {replica, false, a.stage - 1, mb};
    case ActionType::kSendB:
      return {replica, true, a.stage, mb};
    default:  // kRecvB
      return {replica, true, a.stage + 1, mb};
  }
}

// Whether `leaf` consumes the tensor `recv` receives: F of RECV_F's (stage, mb); I or B of
// RECV_B's.
bool Consumes(const Action& leaf, const Action& recv) {
  if (leaf.stage != recv.stage || leaf.microbatch != recv.microbatch) return false;
  if (recv.type == ActionType::kRecvF) return leaf.type == ActionType::kForward;
  return schedule::IsBackwardInputOrFull(leaf.type);
}

// The end of the wait of the first action after `recv_index` on `actions` that consumes what
// that RECV receives, if it waited.
std::optional<double> ConsumerWaitEnd(const std::vector<schedule::TimedAction>& actions,
                                      const std::vector<double>& waits, size_t recv_index) {
  const Action& recv = actions[recv_index].action;
  for (size_t j = recv_index + 1; j < actions.size(); ++j) {
    for (const Action* leaf : schedule::LeafActions(actions[j].action)) {
      if (!Consumes(*leaf, recv)) continue;
      if (waits[j] <= 0) return std::nullopt;
      return actions[j].start + waits[j];
    }
  }
  return std::nullopt;
}

// Every SEND paired with its peer's RECV (the first of each, should a list repeat one), as the
// simulator orders messages: by start, then by sending rank.
std::vector<schedule::Message> PairMessages(
    const std::vector<std::vector<schedule::TimedAction>>& timeline,
    const std::vector<std::vector<double>>& waits, const std::vector<int>& replica_of) {
  const int num_ranks = static_cast<int>(timeline.size());
  std::map<MessageKey, Place> sends, recvs;
  for (int rank = 0; rank < num_ranks; ++rank) {
    for (size_t i = 0; i < timeline[rank].size(); ++i) {
      const Action& a = timeline[rank][i].action;
      if (!schedule::IsSendOrRecv(a.type)) continue;
      const bool is_send = a.type == ActionType::kSendF || a.type == ActionType::kSendB;
      (is_send ? sends : recvs).try_emplace(KeyOf(replica_of[rank], a), Place{rank, i});
    }
  }
  std::vector<schedule::Message> messages;
  for (const auto& [key, send_at] : sends) {
    auto it = recvs.find(key);
    if (it == recvs.end()) continue;
    const Place& recv_at = it->second;
    const schedule::TimedAction& send = timeline[send_at.rank][send_at.index];
    const schedule::TimedAction& recv = timeline[recv_at.rank][recv_at.index];
    schedule::Message m;
    m.send = send.action;
    m.recv = recv.action;
    m.from_rank = send_at.rank;
    m.to_rank = recv_at.rank;
    m.posted_send = send.start;
    m.posted_recv = recv.start;
    m.start = send.start;
    m.arrive = std::max(send.start, recv.end);
    if (auto waited = ConsumerWaitEnd(timeline[recv_at.rank], waits[recv_at.rank], recv_at.index)) {
      m.arrive = std::max(m.arrive, *waited);
    }
    messages.push_back(std::move(m));
  }
  std::stable_sort(messages.begin(), messages.end(),
                   [](const schedule::Message& a, const schedule::Message& b) {
                     return std::tie(a.start, a.from_rank) < std::tie(b.start, b.from_rank);
                   });

  return messages;
}

}  // namespace

absl::StatusOr<std::string> MeasuredStepTrace(const std::vector<RankStepTiming>& ranks,
                                              const std::string& title,
                                              const std::string& step_id) {
  int num_ranks = 0;
  absl::Time base = absl::InfiniteFuture();
  for (const RankStepTiming& r : ranks) {
    if (r.rank < 0)
      return absl::InvalidArgumentError(absl::StrCat("rank ", r.rank, " is negative"));
    num_ranks = std::max(num_ranks, r.rank + 1);
    base = std::min(base, r.start);
  }

  // Timelines in microseconds since `base`; waits[r][i] is timeline[r][i]'s wait_us.
  std::vector<std::vector<schedule::TimedAction>> timeline(num_ranks);
  std::vector<std::vector<double>> waits(num_ranks);
  std::vector<bool> seen(num_ranks, false);
  std::vector<int> replica_of(num_ranks, 0);
  for (const RankStepTiming& r : ranks) {
    if (seen[r.rank]) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", r.rank, " is listed twice"));
    }
    seen[r.rank] = true;
    replica_of[r.rank] = r.replica;
    if (r.actions.size() != r.timings.size()) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", r.rank, " reports ", r.actions.size(),
                                                     " actions but ", r.timings.size(),
                                                     " action timings"));
    }
    const double offset = absl::ToDoubleMicroseconds(r.start - base);
    for (size_t i = 0; i < r.actions.size(); ++i) {
      auto action = schedule::ParseRequiredAction(r.actions[i]);
      if (!action.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", r.rank, ", action ", i, ": ", action.status().message()));
      }
      const v1::ActionTiming& t = r.timings[i];
      if (t.end_us() < t.start_us()) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", r.rank, ", action ", i, " (", r.actions[i], "): ends at ",
                         t.end_us(), " us, before its start at ", t.start_us(), " us"));
      }
      timeline[r.rank].push_back({*std::move(action), offset + static_cast<double>(t.start_us()),
                                  offset + static_cast<double>(t.end_us())});
      waits[r.rank].push_back(static_cast<double>(t.wait_us()));
    }
  }

  std::vector<schedule::Message> messages = PairMessages(timeline, waits, replica_of);
  schedule::ChromeTraceOptions options;
  options.microseconds_per_unit = 1;
  options.title = title;
  options.step_id = step_id;
  for (const RankStepTiming& r : ranks) {
    if (!r.label.empty()) {
      options.process_names.resize(num_ranks);
      options.process_names[r.rank] = r.label;
    }
    const double offset = absl::ToDoubleMicroseconds(r.start - base);
    for (const v1::ReductionBucket& b : r.reduction) {
      options.spans.push_back(schedule::TraceSpan{
          r.rank, absl::StrCat("reduce stage ", b.stage()),
          offset + absl::ToDoubleMicroseconds(rpc::FromProtoDuration(b.start())),
          offset + absl::ToDoubleMicroseconds(rpc::FromProtoDuration(b.end())), b.bytes(), ""});
    }
    for (const v1::ReductionBucket& g : r.gathers) {
      options.spans.push_back(schedule::TraceSpan{
          r.rank, absl::StrCat("gather stage ", g.stage()),
          offset + absl::ToDoubleMicroseconds(rpc::FromProtoDuration(g.start())),
          offset + absl::ToDoubleMicroseconds(rpc::FromProtoDuration(g.end())), g.bytes(),
          "parameter gathering"});
    }
  }
  return schedule::FormatChromeTrace(timeline, messages, options);
}

StepTraceStore::StepTraceStore(int capacity) : capacity_(std::max(capacity, 1)) {}

void StepTraceStore::Add(int64_t global_step, RankStepTiming rank) {
  if (static_cast<int>(steps_.size()) >= capacity_ && steps_.count(global_step) == 0 &&
      global_step < steps_.begin()->first) {
    return;  // older than every kept step
  }
  const int r = rank.rank;
  steps_[global_step][r] = std::move(rank);
  while (static_cast<int>(steps_.size()) > capacity_) steps_.erase(steps_.begin());
}

const std::map<int, RankStepTiming>* StepTraceStore::LatestComplete(int num_ranks,
                                                                    int64_t* step) const {
  for (auto it = steps_.rbegin(); it != steps_.rend(); ++it) {
    bool complete = true;
    for (int r = 0; r < num_ranks && complete; ++r) complete = it->second.count(r) > 0;
    if (complete) {
      *step = it->first;
      return &it->second;
    }
  }
  *step = -1;
  return nullptr;
}

absl::StatusOr<std::string> StepTraceStore::Trace(int64_t global_step, int num_ranks,
                                                  const std::string& title, int64_t* traced_step,
                                                  const std::string& job_id) const {
  const std::string kept =
      steps_.empty() ? std::string("no steps are kept")
                     : absl::StrCat("steps ", first_kept(), "..", last_kept(), " are kept");
  auto complete = [num_ranks](const std::map<int, RankStepTiming>& by_rank) {
    for (int r = 0; r < num_ranks; ++r) {
      if (by_rank.count(r) == 0) return false;
    }
    return true;
  };
  auto found = steps_.end();
  if (global_step < 0) {
    for (auto it = steps_.rbegin(); it != steps_.rend(); ++it) {
      if (complete(it->second)) {
        found = std::prev(it.base());
        break;
      }
    }
    if (found == steps_.end()) {
      return absl::NotFoundError(
          absl::StrCat("no kept step has reports from all ", num_ranks, " ranks (", kept, ")"));
    }
  } else {
    found = steps_.find(global_step);
    if (found == steps_.end()) {
      return absl::NotFoundError(absl::StrCat("step ", global_step, " is not kept (", kept, ")"));
    }
    if (!complete(found->second)) {
      std::vector<int> missing;
      for (int r = 0; r < num_ranks; ++r) {
        if (found->second.count(r) == 0) missing.push_back(r);
      }
      return absl::NotFoundError(absl::StrCat("step ", global_step, " lacks the reports of ranks ",
                                              absl::StrJoin(missing, ", "), " (", kept, ")"));
    }
  }
  std::vector<RankStepTiming> ranks;
  for (const auto& [r, timing] : found->second) {
    if (r < num_ranks) ranks.push_back(timing);
  }
  const std::string step_id =
      absl::StrCat(job_id, job_id.empty() ? "" : "/", "step-", found->first);
  ASSIGN_OR_RETURN(std::string trace, MeasuredStepTrace(ranks, title, step_id));
  if (traced_step != nullptr) *traced_step = found->first;
  return trace;
}

int64_t StepTraceStore::first_kept() const { return steps_.empty() ? -1 : steps_.begin()->first; }

int64_t StepTraceStore::last_kept() const { return steps_.empty() ? -1 : steps_.rbegin()->first; }

void StepTraceStore::DropAfter(int64_t global_step) {
  steps_.erase(steps_.upper_bound(global_step), steps_.end());
}

}  // namespace stagecoach::coordinator
