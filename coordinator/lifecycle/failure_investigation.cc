#include "coordinator/lifecycle/failure_investigation.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/schedule/action.h"

namespace stagecoach::coordinator {

std::string RankLabel(int rank, int replica) {
  return replica > 0 ? absl::StrCat("rank ", rank, " of replica ", replica)
                     : absl::StrCat("rank ", rank);
}

std::string WorkerLabel(const std::string& worker_id, int rank, int replica) {
  return absl::StrCat("worker ", worker_id, " (", RankLabel(rank, replica), ")");
}

std::string FailedAction(const std::string& error) {
  for (absl::string_view word : absl::StrSplit(error, absl::ByAnyChar(" :,;()'\"\t\n"))) {
    if (word.size() < 2 || !absl::ascii_isdigit(word[0])) continue;
    auto action = schedule::ParseAction(word);
    if (action.ok() && action->has_value()) return std::string(word);
  }
  return "";
}

RootCause FailureInvestigation::Investigate(const ReportedFailure& reported,
                                            const std::vector<Peer>& peers) const {
  RootCause out;
  for (const Peer& peer : peers) {
    auto status = workers_->GetStatus(peer.address, probe_timeout_);
    if (status.ok()) continue;
    const std::string why = absl::StrCat("unreachable: ", status.status().message());
    out.lost.emplace_back(peer.worker_id, why);
    absl::StrAppend(&out.reason, out.reason.empty() ? "" : "; ",
                    WorkerLabel(peer.worker_id, peer.rank, peer.replica), " lost: ", why);
    if (out.failure.worker_id().empty()) {
      out.failure.set_rank(peer.rank);
      out.failure.set_replica(peer.replica);
      out.failure.set_worker_id(peer.worker_id);
      out.failure.set_error(absl::StrCat("lost: ", why));
    }
  }
  if (out.reason.empty()) {
    out.reason = absl::StrCat(RankLabel(reported.rank, reported.replica), " (worker ",
                              reported.worker_id, ") failed: ", reported.error);
    out.failure.set_rank(reported.rank);
    out.failure.set_replica(reported.replica);
    out.failure.set_worker_id(reported.worker_id);
    out.failure.set_error(reported.error);
    out.failure.set_action(FailedAction(reported.error));
  } else {
    absl::StrAppend(&out.reason, " (", RankLabel(reported.rank, reported.replica),
                    " reported: ", reported.error, ")");
  }
  return out;
}

}  // namespace stagecoach::coordinator
