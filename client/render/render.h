// How stagectl shows jobs and workers: tables for people, JSON and YAML for programs.
// JSON keys are snake_case and enum values drop their prefix ("SUCCEEDED"), as DESIGN.md fixes
// for `stagectl status JOB -o json`.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "stagecoach/v1/coordinator.pb.h"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::client {

enum class OutputFormat { kTable, kJson, kYaml };

// "table", "json" or "yaml"; INVALID_ARGUMENT otherwise.
absl::StatusOr<OutputFormat> ParseOutputFormat(const std::string& text);

// Enum names without their prefix: "RUNNING", "IDLE".
std::string StateName(v1::JobState state);
std::string StateName(v1::WorkerState state);
// Whether `state` is final (SUCCEEDED, FAILED, CANCELLED): WatchJob's stream ends after it.
bool IsFinalState(v1::JobState state);

// UTC, RFC 3339 with milliseconds: "2026-11-21T13:15:49.123Z".
std::string TimestampString(const google::protobuf::Timestamp& t);

// A job for programs: every field stagectl shows, snake_case (DESIGN.md "Command-line contract"),
// including global_steps_done, pause_at_global_step, attempt, restarts, max_restarts and (when
// the job has one) failure.
nlohmann::json JobJson(const v1::Job& job);
// {"rank", "worker_id", "action", "error", "time"}.
nlohmann::json FailureJson(const v1::JobFailure& failure);
// "rank 2 on w-3 at 2RECV_F3: lost: missed heartbeats for 3s" (parts left out when unknown).
std::string FailureText(const v1::JobFailure& failure);
// GetJobSchedule's answer for programs: {"job_id", "schedule", "num_stages", "num_ranks",
// "microbatches", "ranks": [{"rank", "stages", "compute_actions", "lowered_actions"}], "grid",
// "lowered_grid"}.
nlohmann::json JobScheduleJson(const std::string& job_id, const v1::GetJobScheduleResponse& s);
// `table` for kTable, else `value` as indented JSON or YAML (each ending in a newline).
std::string Render(OutputFormat format, const nlohmann::json& value, const std::string& table);
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
