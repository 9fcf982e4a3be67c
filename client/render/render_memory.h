// `stagectl status`'s memory section: per pipeline rank, the planner's predicted static bytes
// and activation peak (with the action it happens in) beside the peak the workers measured in
// the latest step and the most in any step (Job.memory).
#pragma once

#include <string>

#include "nlohmann/json.hpp"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::client {

// A table with a header row and one row per rank ("-" where a value is not known, and the
// measured peak as a share of the prediction), ending with "\n"; empty when the job has no
// memory figures.
std::string MemoryTable(const v1::Job& job);

// The same figures for `-o json`: a list of {rank, predicted_static_bytes, predicted_peak_bytes,
// predicted_peak_action, measured_peak_bytes, measured_max_bytes}.
nlohmann::json MemoryJson(const v1::Job& job);

}  // namespace stagecoach::client
