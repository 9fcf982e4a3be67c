#include "client/render/render_diagnosis.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/render/render.h"

namespace stagecoach::client {
namespace {

double Seconds(const google::protobuf::Duration& d) {
  return static_cast<double>(d.seconds()) + d.nanos() * 1e-9;
}

std::string RankName(int replica, int rank, bool replicated) {
  return replicated ? absl::StrCat("replica ", replica, " rank ", rank)
                    : absl::StrCat("rank ", rank);
}

bool Replicated(const google::protobuf::RepeatedPtrField<v1::RankDiagnosis>& ranks) {
  return std::any_of(ranks.begin(), ranks.end(),
                     [](const v1::RankDiagnosis& r) { return r.replica() > 0; });
}

std::string StallText(const v1::JobStall& stall) {
  std::ostringstream out;
  out << absl::StrFormat("step %d has run %.1f s (stall bound %.1f s, passed at %s)\n",
                         stall.global_step(), Seconds(stall.running()), Seconds(stall.bound()),
                         TimestampString(stall.since()));
  const bool replicated = Replicated(stall.ranks());
  for (const v1::RankDiagnosis& r : stall.ranks()) {
    out << "           " << RankName(r.replica(), r.rank(), replicated) << ": " << r.summary()
        << "\n";
  }
  return out.str();
}

std::string StragglerText(const v1::RankStraggler& s) {
  std::vector<std::string> kinds;
  for (const auto& [kind, ratio] : s.kind_ratios()) {
    kinds.push_back(absl::StrFormat("%s %.2fx", kind, ratio));
  }
  std::sort(kinds.begin(), kinds.end());
  return absl::StrFormat("replica %d rank %d (%s) at %.2fx its peers' compute over %d steps (%s)",
                         s.replica(), s.rank(), s.worker_id(), s.ratio(), s.window_steps(),
                         absl::StrJoin(kinds, ", "));
}

}  // namespace

std::string DiagnosisEventLine(const v1::JobEvent& event, absl::TimeZone zone) {
  const std::string time =
      absl::FormatTime("%H:%M:%S", absl::FromUnixSeconds(event.time().seconds()), zone);
  if (event.has_stalled())
    return absl::StrCat(time, " STALLED   ", StallText(event.stalled().stall()));
  if (event.has_stall_ended()) {
    const v1::JobStall& s = event.stall_ended().stall();
    return absl::StrFormat("%s UNSTALLED step %d completed after %.1f s", time, s.global_step(),
                           Seconds(s.running()));
  }
  if (event.has_straggler()) {
    return absl::StrCat(time, event.straggler().straggling() ? " STRAGGLING " : " ON PACE   ",
                        StragglerText(event.straggler().straggler()));
  }
  return "";
}

nlohmann::json DiagnosisEventJson(const v1::JobEvent& event) {
  nlohmann::json out;
  if (event.has_stalled()) {
    out["event"] = "stalled";
    out["stall"] = ProtoJson(event.stalled().stall());
  } else if (event.has_stall_ended()) {
    out["event"] = "stall_ended";
    out["stall"] = ProtoJson(event.stall_ended().stall());
  } else if (event.has_straggler()) {
    out["event"] = "straggler";
    out["straggling"] = event.straggler().straggling();
    out["straggler"] = ProtoJson(event.straggler().straggler());
  }
  return out;
}

nlohmann::json ProtoJson(const google::protobuf::Message& message) {
  std::string text;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(message, &text, options).ok()) return {};
  return nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
}

std::string DiagnosisLines(const v1::Job& job) {
  std::ostringstream out;
  if (job.has_stall()) out << "Stalled:   " << StallText(job.stall());
  for (const v1::RankStraggler& s : job.stragglers()) {
    out << "Straggling: " << StragglerText(s) << "\n";
  }
  return out.str();
}

std::string DiagnoseText(const v1::DiagnoseJobResponse& d, int timeline) {
  std::ostringstream out;
  out << "Job:       " << d.job_id() << " (" << StateName(d.state()) << ", attempt " << d.attempt()
      << ")\n";
  out << "Step:      " << d.global_steps_done() << " (global steps done)\n";
  out << absl::StrFormat("Bound:     %.1f s (median step %.3f s)\n", Seconds(d.stall_bound()),
                         Seconds(d.median_step()));
  if (d.has_stall()) out << "Stalled:   " << StallText(d.stall());
  for (const v1::RankStraggler& s : d.stragglers())
    out << "Straggling: " << StragglerText(s) << "\n";
  if (d.ranks().empty()) {
    out << "\nNo ranks: the job is not placed"
        << (IsFinalState(d.state()) ? " any more (it has ended)" : " yet") << ".\n";
    return out.str();
  }
  const bool replicated = Replicated(d.ranks());
  for (const v1::RankDiagnosis& r : d.ranks()) {
    out << "\n"
        << RankName(r.replica(), r.rank(), replicated) << " on " << r.worker_id() << " ("
        << r.address() << ")";
    if (r.has_progress()) out << absl::StrFormat(", beacon %.1f s old", Seconds(r.beacon_age()));
    out << "\n  " << r.summary() << "\n";
    const auto& recent = r.progress().recent();
    const int first = std::max(0, recent.size() - timeline);
    for (int i = first; i < recent.size(); ++i) {
      const v1::RecentAction& a = recent[i];
      out << absl::StrFormat(
          "    step %-5d %-12s ran %8.3f ms (waited %8.3f ms), ended %.3f s ago\n", a.global_step(),
          a.action(), a.duration_us() / 1e3, a.wait_us() / 1e3, a.ended_us_ago() / 1e6);
    }
  }
  return out.str();
}

}  // namespace stagecoach::client
