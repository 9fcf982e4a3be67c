// stagectl's commands against a coordinator. Each returns the process exit code: 0 success,
// 1 a failed operation or a job that did not succeed, 2 a usage error. Output goes to `out`,
// progress and errors to `err`.
#pragma once

#include <iosfwd>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/render/render.h"
#include "common/rpc/channel.h"
#include "stagecoach/v1/coordinator.grpc.pb.h"

namespace stagecoach::client {

struct ClientOptions {
  std::string coordinator;  // host:port
  OutputFormat format = OutputFormat::kTable;
  // Bound on every unary call (SubmitJob gets kSubmitInspectionAllowance more).
  absl::Duration timeout = absl::Seconds(15);
  // TLS credentials and the client token (--tls-*, --token-file) for the coordinator channel;
  // plaintext without a token by default.
  rpc::ChannelSecurity security;
};

// How much longer than other calls SubmitJob may take: the coordinator may inspect (and profile)
// the model on a worker before it answers.
inline constexpr absl::Duration kSubmitInspectionAllowance = absl::Seconds(150);

// Local files `submit` uploads to the coordinator's artifact store before it sends the spec;
// the spec's field then names the upload ("artifact:<sha256>"). Empty: nothing to upload.
struct SubmitUploads {
  std::string model;  // --model: replaces model.torchscript
  std::string data;   // --data: replaces data.path
};

// The command line of `stagectl step`, as parsed (checked by ValidateStepOptions).
struct StepOptions {
  std::string inputs;          // --inputs: stage 0's batch (.npy), required
  std::string targets;         // --targets: the loss targets (.npy); required unless forward_only
  bool forward_only = false;   // --forward-only: inference on the job's current weights
  std::string save_outputs;    // --save-outputs: write the outputs here (forward-only only)
  std::string timeout = "5m";  // --timeout: how long to wait for the step
};

// Checks a `step` command line and returns its timeout. INVALID_ARGUMENT whose message starts
// with the flag at fault: --inputs missing, --targets missing for a training step (or given with
// --forward-only), --save-outputs without --forward-only, or a --timeout that is not a positive
// duration (30s, 5m).
absl::StatusOr<absl::Duration> ValidateStepOptions(const StepOptions& options);

// How much of a job's history `status` asks for (GetJobRequest's history fields).
struct HistoryRequest {
  bool all = false;
  int64_t from = 0;
  int steps = 0;  // > 0: a page of this many steps from job step `from`
};

// Prints a failed call's error to `err` and returns 1. UNAVAILABLE becomes a message saying the
// coordinator at `coordinator` cannot be reached and how to point stagectl at it; UNIMPLEMENTED
// says the coordinator may be older than this stagectl.
int ReportRpcError(std::ostream& err, const std::string& coordinator, const grpc::Status& status,
                   const std::string& what);

class Commands {
 public:
  // Bytes per UploadArtifact message.
  static constexpr int kUploadChunkBytes = 1 << 20;

  Commands(ClientOptions options, std::ostream& out, std::ostream& err);

  // Submits the spec in `spec_path`, first uploading the files in `uploads` (each reported on
  // `err` as "uploaded NAME (SIZE, N chunks) as artifact:<sha256>"). A file that cannot be
  // read, or --model with a spec whose model is builtin, is a usage error (2). `paused` submits
  // the job paused (start_paused): it is placed and started, then holds before its first step.
  int Submit(const std::string& spec_path, bool wait, const SubmitUploads& uploads = {},
             bool paused = false);
  int List();
  // The job with the latest 100 steps of its history (losses, bubble ratios, skipped steps,
  // evals) and state changes; `history` chooses the whole or a page.
  int Status(const std::string& job_id, const HistoryRequest& history = HistoryRequest());
  // Follows the job until it ends: a redrawn progress line with state changes above it on a
  // terminal (table format), one plain line per event otherwise, one JSON object per line with
  // -o json, one YAML document per event with -o yaml. 0 when the job SUCCEEDED, else 1.
  int Watch(const std::string& job_id);
  // Cancels the job; prints "ID STATE" (json/yaml: {job_id, state}).
  int Cancel(const std::string& job_id);
  // Pauses a running job after the current step and prints the global step every rank holds at
  // (json/yaml: {job_id, global_step, state}).
  int Pause(const std::string& job_id);
  // Resumes a paused job; prints its state and position (json/yaml: {job_id, state,
  // global_steps_done, steps_done, steps_total}).
  int Resume(const std::string& job_id);
  // Runs `steps` more steps (>= 1, else a usage error naming --steps) and prints the global step
  // the job runs until (json/yaml: {job_id, until_global_step, state, steps_total}).
  int RunSteps(const std::string& job_id, int64_t steps);
  // One step of a paused job on a client batch (StepJob). Training: prints the global step and
  // loss (json/yaml add microbatch_losses). Forward-only: writes the outputs to
  // options.save_outputs, or prints them (a summary, or the values with -o json|yaml). A command
  // line ValidateStepOptions refuses, or an .npy file that cannot be read, is a usage error (2).
  int Step(const std::string& job_id, const StepOptions& options);
  // A running job's schedule from the coordinator: the compute grid (the lowered one with
  // `lowered`), or GetJobSchedule's answer with -o json|yaml (JobScheduleJson). Written to
  // `out_path` instead of stdout when it is set.
  int JobSchedule(const std::string& job_id, bool lowered, const std::string& out_path);
  // Writes the Chrome trace of one step (`global_step`; -1 = the latest) to `out_path` and prints
  // the step and the range of steps still kept (json/yaml: {job_id, global_step,
  // first_kept_step, last_kept_step, out, bytes}).
  int Trace(const std::string& job_id, int64_t global_step, const std::string& out_path);
  // `stagectl diagnose JOB`: what each rank does now, its recent actions, the job's stall and
  // stragglers (DiagnoseJob).
  int Diagnose(const std::string& job_id, int timeline);
  // Asks a running job for a checkpoint now and prints the step it is taken after and its
  // directory (table: "step N: DIR"; json/yaml: {job_id, step, directory}). The checkpoint is
  // complete once `status` lists it.
  int Checkpoint(const std::string& job_id);
  int Workers();
  // Asks the coordinator to search plans for the spec in `spec_path` (PlanSpec: the model is
  // profiled on a worker, every open schedule x stages per worker x microbatches x split
  // simulated) and prints them ranked: the first `top` (all with -o json|yaml, PlanJson).
  // `memory_limit` ("8GiB"; empty: the spec's placement.memory_limit) that is no byte size is
  // a usage error naming --memory-limit. `uploads` as for Submit.
  int Plan(const std::string& spec_path, const std::string& memory_limit, int top,
           const SubmitUploads& uploads = {});
  // `stagectl inspect MODEL`: a worker loads the TorchScript model (a path on the workers, an
  // artifact uri, or with `upload` a local file uploaded first) and the model's layers and the
  // split points it offers, nested ones included, are printed with their parameter counts
  // (ModelTable; ModelJson with -o json|yaml). `device` ("cpu", "cuda"; empty: any) picks the
  // worker. Exit 1 when the coordinator or the worker refuses the model (its message).
  int Inspect(const std::string& model, bool upload, const std::string& device);
  // `stagectl plan --job JOB`: the job's schedule and split, and per rank the plan's predicted
  // compute and bubble beside those its latest traced step measured and the bubble the schedule
  // gives that step's measured costs (BalanceTable; BalanceJson with -o json|yaml).
  int PlanOfJob(const std::string& job_id);
  // Runs forward-only inference of the spec's model on the batch in `input_path` (.npy) and
  // writes the outputs to `out_path` (.npy), or prints them when it is empty: a summary (table)
  // or the tensor's shape and values (json, yaml). `timeout` bounds the whole run, queueing
  // included.
  int Infer(const std::string& spec_path, const std::string& input_path,
            const std::string& out_path, absl::Duration timeout);

 private:
  // Reads the spec in `spec_path` for `command` ("submit", "plan"), uploads `uploads` and
  // inlines its schedule.csv file (see Submit) into `*spec_yaml`; returns 0, or the exit code
  // after printing the problem.
  int ReadSpec(const std::string& command, const std::string& spec_path,
               const SubmitUploads& uploads, std::string* spec_yaml);
  // Prints a failed call's error and returns 1. UNAVAILABLE becomes a message saying the
  // coordinator cannot be reached and how to point stagectl at it.
  int RpcError(const grpc::Status& status, const std::string& what);
  // One unary call of the coordinator's, bounded by --timeout (`timeout` when given).
  template <typename Request, typename Response>
  grpc::Status Call(grpc::Status (v1::CoordinatorService::Stub::*method)(grpc::ClientContext*,
                                                                         const Request&, Response*),
                    const Request& request, Response* response,
                    std::optional<absl::Duration> timeout = std::nullopt) {
    grpc::ClientContext ctx;
    rpc::SetDeadline(&ctx, timeout.value_or(options_.timeout));
    return (stub_.get()->*method)(&ctx, request, response);
  }
  // Streams the job's events to `progress` in `format` (see Watch) until it ends; returns the
  // exit code for its final state.
  int Follow(const std::string& job_id, std::ostream& progress, OutputFormat format);
  // Prints `table` or `json` in the chosen output format; returns 0.
  int Print(const nlohmann::json& json, const std::string& table);
  // Uploads the file at `path` (named by option `flag` in messages, which start with
  // "stagectl: `command`:") and sets `*uri` to the artifact's uri. Returns 0, 2 when the file
  // cannot be read, or 1 when the upload fails.
  int UploadFile(const std::string& command, const std::string& path, const std::string& flag,
                 std::string* uri);

  ClientOptions options_;
  std::ostream& out_;
  std::ostream& err_;
  std::unique_ptr<v1::CoordinatorService::Stub> stub_;
};

}  // namespace stagecoach::client
