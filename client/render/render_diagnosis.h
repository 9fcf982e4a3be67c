// How stagectl shows a running job's diagnosis (docs/diagnosis.md): the STALLED condition with
// each rank's action and wait, the stragglers, and `stagectl diagnose`'s per-rank view with
// each rank's recent action timeline. Pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "absl/time/time.h"
#include "stagecoach/v1/coordinator.pb.h"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::client {

// For `stagectl status`: "Stalled:   step 12 has run 41.2 s (bound 30.0 s)\n" then a line per
// rank, and "Straggling: replica 1 rank 0 (w-3) at 1.62x its peers' compute ...\n"; empty for a
// job with neither.
std::string DiagnosisLines(const v1::Job& job);

// `stagectl diagnose JOB`: the job's step and stall bound, its stall and stragglers, then each
// rank: its worker and address, its beacon's age and summary, and its latest `timeline` actions.
std::string DiagnoseText(const v1::DiagnoseJobResponse& diagnosis, int timeline = 8);

// A watch line for a stalled, stall_ended or straggler event ("12:00:03 STALLED   step 12 ...",
// with the ranks' lines below it); empty for other events.
std::string DiagnosisEventLine(const v1::JobEvent& event, absl::TimeZone zone);
// Their JSON ({"event": "stalled", "stall": {...}}); null for other events.
nlohmann::json DiagnosisEventJson(const v1::JobEvent& event);

// Any message as JSON (protobuf's JSON mapping, field names in snake_case).
nlohmann::json ProtoJson(const google::protobuf::Message& message);

}  // namespace stagecoach::client
