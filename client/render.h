// How stagectl shows jobs and workers: tables for people, JSON and YAML for programs.
// JSON keys are snake_case and enum values drop their prefix ("SUCCEEDED"), as DESIGN.md fixes
// for `stagectl status JOB -o json`.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::client {

enum class OutputFormat { kTable, kJson, kYaml };

// "table", "json" or "yaml"; INVALID_ARGUMENT otherwise.
absl::StatusOr<OutputFormat> ParseOutputFormat(const std::string& text);

// Enum names without their prefix: "RUNNING", "IDLE".
std::string StateName(v1::JobState state);
std::string StateName(v1::WorkerState state);

nlohmann::json JobJson(const v1::Job& job);
nlohmann::json WorkerJson(const v1::WorkerInfo& worker);

// JSON rendered as YAML (block style, keys in JSON order).
std::string ToYaml(const nlohmann::json& value);

// One row per job / worker, aligned columns.
std::string JobsTable(const std::vector<v1::Job>& jobs);
std::string WorkersTable(const std::vector<v1::WorkerInfo>& workers);
// The human view of one job: state, reason, progress, ranks, recent losses.
std::string JobDetails(const v1::Job& job);

// An Infer result for people: the job, the outputs' dtype and shape, and their first values.
std::string TensorSummary(const std::string& job_id, const v1::TensorData& tensor);
// An Infer result for programs: {"job_id", "dtype", "shape", "values"}, values nested like
// numpy's tolist(). `tensor` must be valid (rpc::ValidateTensorData).
nlohmann::json TensorJson(const std::string& job_id, const v1::TensorData& tensor);

// A table of rows with a header row; columns padded to their widest cell.
std::string FormatTable(const std::vector<std::vector<std::string>>& rows);

}  // namespace stagecoach::client
