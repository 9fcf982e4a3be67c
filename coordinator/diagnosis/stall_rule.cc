#include "coordinator/diagnosis/stall_rule.h"

#include <algorithm>
#include <cctype>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/rpc/time_conversion.h"

namespace stagecoach::coordinator {
namespace {

std::string Seconds(absl::Duration d) {
  return absl::StrFormat("%.1f s", absl::ToDoubleSeconds(std::max(d, absl::ZeroDuration())));
}

absl::Duration Micros(int64_t us) { return absl::Microseconds(us); }

// "rank 1 (host-b:41234)": `peer` of the same replica as `self`.
std::string PeerName(int peer, const RankView& self, const std::vector<RankView>& all) {
  for (const RankView& r : all) {
    if (r.rank == peer && r.replica == self.replica && !r.address.empty()) {
      return absl::StrCat("rank ", peer, " (", r.address, ")");
    }
  }
  return absl::StrCat("rank ", peer);
}

// "replica 1 (host-c:41236)": the same rank of the other replicas, whose all-gathers `self`
// takes part in; "its replicas" when none is known.
std::string ReplicaPeers(const RankView& self, const std::vector<RankView>& all) {
  std::string out;
  for (const RankView& r : all) {
    if (r.rank != self.rank || r.replica == self.replica) continue;
    absl::StrAppend(&out, out.empty() ? "" : ", ", "replica ", r.replica,
                    r.address.empty() ? "" : absl::StrCat(" (", r.address, ")"));
  }
  return out.empty() ? "its replicas" : out;
}

// What the beacon `p` says the rank does, `age` after it was read.
std::string Activity(const v1::RankProgress& p, absl::Duration age, const RankView& self,
                     const std::vector<RankView>& all) {
  const int64_t step = p.global_step();
  const absl::Duration in_phase = Micros(p.phase_elapsed_us()) + age;
  if (p.has_wait() && absl::StartsWith(p.wait().kind(), "JOB_REDUCTION")) {
    // The recipe's sum over the pipeline's ranks (gradient norm, non-finite flags): a chain.
    const v1::RankWait& w = p.wait();
    const bool send = absl::EndsWith(w.kind(), "send");
    return absl::StrCat("in step ", step, "'s optimizer step, its job reduction ",
                        send ? "sending to " : "receiving from ",
                        PeerName(w.peer_rank(), self, all), " (tag ", w.tag(), "), waiting ",
                        Seconds(Micros(w.waited_us()) + age));
  }
  switch (p.phase()) {
    case v1::RANK_PHASE_ACTIONS:
    case v1::RANK_PHASE_SENDS: {
      if (p.has_wait()) {
        const v1::RankWait& w = p.wait();
        const absl::Duration waited = Micros(w.waited_us()) + age;
        if (w.kind() == "ALL_GATHER") {
          const std::string in = p.action().empty()
                                     ? std::string()
                                     : absl::StrCat("in ", DescribeAction(p.action()), ", ");
          return absl::StrCat(in, "waiting for the all-gather of stage ", w.stage(),
                              "'s parameters with ", ReplicaPeers(self, all), " for ",
                              Seconds(waited));
        }
        if (w.kind() == "SEND") {
          const std::string finished =
              p.recent().empty()
                  ? std::string()
                  : absl::StrCat("finished ", DescribeAction(p.recent().rbegin()->action()), ", ");
          return absl::StrCat(finished, "waiting on the send to ",
                              PeerName(w.peer_rank(), self, all), " (tag ", w.tag(), ") for ",
                              Seconds(waited));
        }
        return absl::StrCat(w.kind(), " stage ", w.stage(), " microbatch ", w.microbatch(),
                            " from ", PeerName(w.peer_rank(), self, all), " (tag ", w.tag(),
                            "), waiting ", Seconds(waited));
      }
      if (!p.action().empty()) {
        return absl::StrCat("in ", DescribeAction(p.action()), " of step ", step, " for ",
                            Seconds(Micros(p.action_elapsed_us()) + age));
      }
      if (p.phase() == v1::RANK_PHASE_SENDS) {
        return absl::StrCat("sent step ", step, "'s values ", Seconds(in_phase), " ago");
      }
      return absl::StrCat("between actions of step ", step, " for ", Seconds(in_phase));
    }
    case v1::RANK_PHASE_REDUCTION:
      return absl::StrCat("reducing step ", step, "'s gradients with its replicas for ",
                          Seconds(in_phase));
    case v1::RANK_PHASE_OPTIMIZER:
      return absl::StrCat("in step ", step, "'s optimizer step for ", Seconds(in_phase));
    case v1::RANK_PHASE_EVAL:
      return absl::StrCat("evaluating after step ", step, " for ", Seconds(in_phase));
    case v1::RANK_PHASE_CHECKPOINT:
      return absl::StrCat("checkpointing after step ", step, " for ", Seconds(in_phase));
    case v1::RANK_PHASE_BETWEEN_STEPS:
      return absl::StrCat("finished step ", step - 1, ", waiting to begin step ", step, " for ",
                          Seconds(in_phase));
    case v1::RANK_PHASE_SETUP:
      return absl::StrCat("setting up for ", Seconds(in_phase));
    default:
      return "in an unknown phase";
  }
}

}  // namespace

std::string DescribeAction(const std::string& action) {
  // <stage><KIND><microbatch>, e.g. "2F5", "0RECV_B3"; anything else is shown as it is.
  size_t i = 0;
  while (i < action.size() && std::isdigit(static_cast<unsigned char>(action[i]))) ++i;
  size_t j = action.size();
  while (j > i && std::isdigit(static_cast<unsigned char>(action[j - 1]))) --j;
  if (i == 0 || j == action.size() || j <= i) return action;
  return absl::StrCat(action.substr(i, j - i), " stage ", action.substr(0, i), " microbatch ",
                      action.substr(j));
}

absl::Duration MedianDuration(std::vector<absl::Duration> steps) {
  if (steps.empty()) return absl::ZeroDuration();
  const size_t mid = steps.size() / 2;
  std::nth_element(steps.begin(), steps.begin() + mid, steps.end());
  if (steps.size() % 2 == 1) return steps[mid];
  const absl::Duration upper = steps[mid];
  const absl::Duration lower = *std::max_element(steps.begin(), steps.begin() + mid);
  return (lower + upper) / 2;
}

absl::Duration StallBound(const StallOptions& options,
                          const std::vector<absl::Duration>& recent_steps) {
  if (options.stall_after.has_value()) return *options.stall_after;
  return std::max(options.floor, MedianDuration(recent_steps) * options.median_factor);
}

std::optional<absl::Duration> StepRunning(const StallInputs& in, const StallOptions& options,
                                          absl::Time now) {
  std::optional<absl::Time> earliest;
  for (const RankView& r : in.ranks) {
    if (r.progress == nullptr) continue;
    const v1::RankProgress& p = *r.progress;
    if (p.phase() == v1::RANK_PHASE_SETUP) {
      const bool heard = now - std::max(r.received, r.last_heartbeat) <= options.silent_after;
      if (heard) return std::nullopt;
      continue;
    }
    // A rank may be a step (or, with its reports in flight, a few) ahead of the steps the
    // coordinator saw complete: its step counts too.
    if (p.global_step() < in.step || p.step_elapsed_us() <= 0) continue;
    const absl::Time began = r.received - Micros(p.step_elapsed_us());
    if (!earliest.has_value() || began < *earliest) earliest = began;
  }
  if (!earliest.has_value()) return std::nullopt;
  return now - std::max(in.step_began, *earliest);
}

std::string SummarizeRank(const RankView& rank, const std::vector<RankView>& all,
                          const StallOptions& options, absl::Time now) {
  const absl::Duration silent = now - std::max(rank.received, rank.last_heartbeat);
  const bool heard =
      rank.received != absl::InfinitePast() || rank.last_heartbeat != absl::InfinitePast();
  if (rank.progress == nullptr) {
    if (heard && silent > options.silent_after) {
      return absl::StrCat("silent for ", Seconds(silent),
                          " (no heartbeat); no progress beacon from it in this attempt");
    }
    return "no progress beacon yet";
  }
  if (silent > options.silent_after) {
    return absl::StrCat("silent for ", Seconds(silent), " (no heartbeat); last heard: ",
                        Activity(*rank.progress, absl::ZeroDuration(), rank, all));
  }
  return Activity(*rank.progress, now - rank.received, rank, all);
}

std::vector<v1::RankDiagnosis> DiagnoseRanks(const std::vector<RankView>& ranks,
                                             const StallOptions& options, absl::Time now) {
  std::vector<v1::RankDiagnosis> out;
  out.reserve(ranks.size());
  for (const RankView& r : ranks) {
    v1::RankDiagnosis d;
    d.set_rank(r.rank);
    d.set_replica(r.replica);
    d.set_worker_id(r.worker_id);
    d.set_address(r.address);
    if (r.progress != nullptr) {
      *d.mutable_progress() = *r.progress;
      *d.mutable_beacon_age() = rpc::ToProtoDuration(now - r.received);
    }
    d.set_summary(SummarizeRank(r, ranks, options, now));
    out.push_back(std::move(d));
  }
  return out;
}

std::optional<v1::JobStall> EvaluateStall(const StallInputs& in, absl::Duration bound,
                                          const StallOptions& options, absl::Time now) {
  const std::optional<absl::Duration> running = StepRunning(in, options, now);
  if (!running.has_value() || *running <= bound) return std::nullopt;
  v1::JobStall stall;
  stall.set_global_step(in.step);
  *stall.mutable_running() = rpc::ToProtoDuration(*running);
  *stall.mutable_bound() = rpc::ToProtoDuration(bound);
  *stall.mutable_since() = rpc::ToProtoTimestamp(now - *running + bound);
  for (v1::RankDiagnosis& d : DiagnoseRanks(in.ranks, options, now)) {
    *stall.add_ranks() = std::move(d);
  }
  return stall;
}

}  // namespace stagecoach::coordinator
