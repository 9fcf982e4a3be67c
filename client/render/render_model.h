// How `stagectl inspect` shows a model's layers and the split points it offers
// (DescribeModelResponse). Pure functions.
#pragma once

#include <string>

#include "nlohmann/json.hpp"
#include "stagecoach/v1/coordinator.pb.h"

namespace stagecoach::client {

// A line naming the model ("MODEL: N layers, a plain chain | cut from its forward graph;
// sha256 S; inspected by W"), then one row per split candidate, indented by its depth:
// SPLIT POINT, PARAMETERS (with thousands separators), LAYER ("layer" for the model's layers,
// blank for the modules that hold layers or that a layer calls), then a note on how a point
// that is not a layer cuts. Ends with "\n".
std::string ModelTable(const std::string& model, const v1::DescribeModelResponse& described);

// {model, model_sha256, inspected_by, sequential, layers: [{name, parameters}],
// split_candidates: [{name, parameters, depth, layer}]}.
nlohmann::json ModelJson(const std::string& model, const v1::DescribeModelResponse& described);

}  // namespace stagecoach::client
