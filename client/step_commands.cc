// stagectl's commands that steer a running job at step boundaries: pause, resume, run N steps,
// one client step with a batch from .npy files, a checkpoint on demand (docs/control.md). Split
// from commands.cc; the Commands class is declared in commands.h.
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/commands.h"
#include "client/message_size.h"
#include "client/npy.h"
#include "client/ragged_rows.h"
#include "client/render/render.h"
#include "common/rpc/tensor_data.h"
#include "common/rpc/time_conversion.h"

namespace stagecoach::client {
namespace {

// The contents of an .npy file named by `flag`, for `command`'s messages.
absl::StatusOr<v1::TensorData> ReadTensorFlag(const std::string& path, const std::string& flag) {
  absl::StatusOr<v1::TensorData> tensor = ReadNpy(path);
  if (!tensor.ok()) {
    return absl::Status(tensor.status().code(),
                        absl::StrCat(flag, ": ", tensor.status().message()));
  }
  return tensor;
}

}  // namespace

absl::StatusOr<absl::Duration> ValidateStepOptions(const StepOptions& options) {
  if (options.inputs.empty()) {
    return absl::InvalidArgumentError("--inputs: required (stage 0's batch, an .npy file)");
  }
  if (options.forward_only && !options.targets.empty()) {
    return absl::InvalidArgumentError(
        "--targets: not used with --forward-only (a forward-only step computes no loss)");
  }
  const bool jsonl_rows = IsRaggedRows(options.inputs) && options.targets.empty() &&
                          absl::EndsWith(options.inputs, ".jsonl");
  if (!options.forward_only && options.targets.empty() && !jsonl_rows) {
    return absl::InvalidArgumentError(
        "--targets: required for a training step (an .npy file, one row per input row); pass "
        "--forward-only for inference");
  }
  if (!options.forward_only && !options.save_outputs.empty()) {
    return absl::InvalidArgumentError(
        "--save-outputs: only with --forward-only (a training step returns losses, not outputs)");
  }
  absl::Duration timeout;
  if (!absl::ParseDuration(options.timeout, &timeout) || timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--timeout: must be a positive duration such as 30s or 5m, got '", options.timeout, "'"));
  }
  return timeout;
}

int Commands::Checkpoint(const std::string& job_id) {
  v1::CheckpointJobRequest req;
  req.set_job_id(job_id);
  v1::CheckpointJobResponse resp;
  grpc::Status status = Call(&v1::CoordinatorService::Stub::CheckpointJob, req, &resp);
  if (!status.ok()) return RpcError(status, absl::StrCat("checkpoint ", job_id));
  return Print({{"job_id", job_id}, {"step", resp.step()}, {"directory", resp.directory()}},
               absl::StrCat("step ", resp.step(), ": ", resp.directory(), "\n"));
}

int Commands::Pause(const std::string& job_id) {
  v1::PauseJobRequest req;
  req.set_job_id(job_id);
  v1::PauseJobResponse resp;
  grpc::Status status = Call(&v1::CoordinatorService::Stub::PauseJob, req, &resp);
  if (!status.ok()) return RpcError(status, absl::StrCat("pause ", job_id));
  const bool held = resp.job().state() == v1::JOB_STATE_PAUSED;
  return Print({{"job_id", job_id},
                {"global_step", resp.global_step()},
                {"state", StateName(resp.job().state())}},
               absl::StrCat(job_id, held ? " PAUSED: holds" : " pausing: will hold",
                            " at global step ", resp.global_step(), "\n"));
}

int Commands::Resume(const std::string& job_id) {
  v1::ResumeJobRequest req;
  req.set_job_id(job_id);
  v1::ResumeJobResponse resp;
  grpc::Status status = Call(&v1::CoordinatorService::Stub::ResumeJob, req, &resp);
  if (!status.ok()) return RpcError(status, absl::StrCat("resume ", job_id));
  const v1::Job& job = resp.job();
  return Print({{"job_id", job_id},
                {"state", StateName(job.state())},
                {"global_steps_done", job.global_steps_done()},
                {"steps_done", job.steps_done()},
                {"steps_total", job.steps_total()}},
               absl::StrCat(job_id, " ", StateName(job.state()), " from global step ",
                            job.global_steps_done(), " (steps ", job.steps_done(), "/",
                            job.steps_total(), ")\n"));
}

int Commands::RunSteps(const std::string& job_id, int64_t steps) {
  if (steps < 1) {
    err_ << "stagectl: run: --steps: must be >= 1, got " << steps << "\n";
    return 2;
  }
  v1::RunStepsRequest req;
  req.set_job_id(job_id);
  req.set_steps(steps);
  v1::RunStepsResponse resp;
  grpc::Status status = Call(&v1::CoordinatorService::Stub::RunSteps, req, &resp);
  if (!status.ok()) return RpcError(status, absl::StrCat("run ", job_id));
  return Print({{"job_id", job_id},
                {"until_global_step", resp.until_global_step()},
                {"state", StateName(resp.job().state())},
                {"steps_total", resp.job().steps_total()}},
               absl::StrCat(job_id, " runs until global step ", resp.until_global_step(), "\n"));
}

int Commands::Step(const std::string& job_id, const StepOptions& options) {
  absl::StatusOr<absl::Duration> timeout = ValidateStepOptions(options);
  if (!timeout.ok()) {
    err_ << "stagectl: step: " << timeout.status().message() << "\n";
    return 2;
  }
  v1::StepJobRequest req;
  req.set_job_id(job_id);
  req.set_forward_only(options.forward_only);
  *req.mutable_timeout() = rpc::ToProtoDuration(*timeout);
  if (IsRaggedRows(options.inputs)) {
    absl::StatusOr<RaggedRows> rows =
        ReadRaggedRows(options.inputs, options.targets, options.forward_only);
    if (!rows.ok()) {
      err_ << "stagectl: step: " << rows.status().message() << "\n";
      return 2;
    }
    *req.mutable_inputs() = std::move(rows->inputs);
    if (!options.forward_only) *req.mutable_targets() = std::move(rows->targets);
    req.mutable_row_lengths()->Add(rows->row_lengths.begin(), rows->row_lengths.end());
  } else {
    absl::StatusOr<v1::TensorData> inputs = ReadTensorFlag(options.inputs, "--inputs");
    if (!inputs.ok()) {
      err_ << "stagectl: step: " << inputs.status().message() << "\n";
      return 2;
    }
    *req.mutable_inputs() = *std::move(inputs);
  }
  if (!options.forward_only && req.row_lengths().empty()) {
    absl::StatusOr<v1::TensorData> targets = ReadTensorFlag(options.targets, "--targets");
    if (!targets.ok()) {
      err_ << "stagectl: step: " << targets.status().message() << "\n";
      return 2;
    }
    *req.mutable_targets() = *std::move(targets);
  }
  if (auto oversize = OversizeBatchError(req.ByteSizeLong(), req.inputs(), "--inputs",
                                         options.inputs,
                                         options.forward_only ? nullptr : &req.targets())) {
    err_ << "stagectl: step: " << *oversize << "\n";
    return 1;
  }
  v1::StepJobResponse resp;
  // The coordinator answers DEADLINE_EXCEEDED at `timeout`; the margin lets that answer arrive.
  grpc::Status status =
      Call(&v1::CoordinatorService::Stub::StepJob, req, &resp, *timeout + options_.timeout);
  if (!status.ok()) return RpcError(status, absl::StrCat("step ", job_id));
  const double seconds = absl::ToDoubleSeconds(rpc::FromProtoDuration(resp.step_time()));
  nlohmann::json json = {
      {"job_id", job_id}, {"global_step", resp.global_step()}, {"step_time_seconds", seconds}};
  if (!options.forward_only) {
    json["loss"] = resp.has_loss() ? nlohmann::json(resp.loss()) : nlohmann::json(nullptr);
    json["microbatch_losses"] =
        std::vector<double>(resp.microbatch_losses().begin(), resp.microbatch_losses().end());
    return Print(json, absl::StrFormat("%s step %d: loss %s (%.3fs)\n", job_id, resp.global_step(),
                                       resp.has_loss() ? absl::StrFormat("%.6f", resp.loss())
                                                       : std::string("-"),
                                       seconds));
  }
  const v1::TensorData& outputs = resp.outputs();
  if (absl::Status valid = rpc::ValidateTensorData(outputs, "outputs"); !valid.ok()) {
    err_ << "stagectl: step: " << job_id << " returned " << valid.message() << "\n";
    return 1;
  }
  const std::string where = absl::StrFormat("%s forward-only at global step %d (%.3fs)", job_id,
                                            resp.global_step(), seconds);
  if (!options.save_outputs.empty()) {
    if (absl::Status written = WriteNpy(options.save_outputs, outputs); !written.ok()) {
      err_ << "stagectl: step: --save-outputs: " << written.message() << "\n";
      return 1;
    }
    json["dtype"] = outputs.dtype();
    json["shape"] = std::vector<int64_t>(outputs.shape().begin(), outputs.shape().end());
    json["outputs_file"] = options.save_outputs;
    return Print(json, absl::StrCat(where, ": ", rpc::DescribeTensorData(outputs), " written to ",
                                    options.save_outputs, "\n"));
  }
  nlohmann::json values = TensorJson(job_id, outputs);
  values["global_step"] = resp.global_step();
  values["step_time_seconds"] = seconds;
  return Print(values, absl::StrCat(where, "\n", TensorSummary(job_id, outputs)));
}

}  // namespace stagecoach::client
