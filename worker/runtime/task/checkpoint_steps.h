// Checkpoint steps: when a task writes its checkpoints, and the reports that carry them.
//   - After a counted step (a data step or a training client step) whose new global step count
//     is a multiple of training.checkpoint.every_steps or one of the requested checkpoint steps
//     (the step gate says which): every stage of the rank is written and the files go with that
//     step's report.
//   - At hold (a paused job's CheckpointJob, StepGate::Action::kCheckpointAtHold): the position
//     the task holds at, reported on its own (checkpoint_only); one already written there is not
//     written twice.
// Asynchronous checkpoints (training.checkpoint.async, the default): at a checkpoint step the
// task copies what the files hold to host memory (checkpoint.h's StateSnapshot; the previous
// asynchronous write, if still running, is waited for first, so at most one copy is held), and a
// background writer (background_writer.h) pickles, hashes and writes the files durably while
// the task trains on; once they are durable it sends them in a checkpoint_only report of the
// step they hold, which is what lets the coordinator write the manifest. So a task killed
// mid-write leaves a step directory without a manifest, and the previous checkpoint stays the
// latest. The task drains the writer before it ends (and before a checkpoint at hold), and a
// failed write fails the task at its next checkpoint or its end. A task that ends without
// draining (stopped or failed) abandons the write after the file in progress. The fault knob
// STAGECOACH_FAULT_CHECKPOINT_STALL_MS makes the writer sleep that long after each file (tests
// that kill a worker mid-write).
//
// Forward-only tasks have no checkpoint directory: they write nothing after steps and refuse a
// checkpoint at hold. With data-parallel replicas the stages of every replica are the same, so
// only replica 0's tasks write the stage files (`writer`); with ZeRO-1 shards every replica also
// writes its optimizer shard of each stage (zero_shards.h), otherwise the others write nothing,
// at hold neither.
//
// Not thread-safe: the task's thread only, between steps. The stages, optimizer and reports
// must outlive it. Errors are WriteStageCheckpoint's (which fail the task).
#pragma once

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "stagecoach/v1/coordinator.pb.h"
#include "worker/model/stage_model.h"
#include "worker/runtime/checkpoint/background_writer.h"
#include "worker/runtime/checkpoint/checkpoint.h"
#include "worker/runtime/sharding/parameter_gathering.h"
#include "worker/runtime/sharding/zero_shards.h"
#include "worker/runtime/task/step_reports.h"

namespace stagecoach::runtime {

struct CheckpointStepsOptions {
  // training.checkpoint.dir, empty for none (forward-only tasks).
  std::string dir;
  // training.checkpoint.every_steps (0 for none).
  int64_t every_steps = 0;
  int rank = 0;
  // Writes the stage files: replica 0's task (the other replicas' stages are the same).
  bool writer = true;
  // With replicas: after each step that is due a checkpoint, every replica reports a SHA-256 of
  // each of its stages' parameters (ReportStepRequest.parameter_digests), so that the coordinator
  // can check the replicas hold the same bits.
  bool digests = false;
  // By stage: a parameter its files leave out (the last stage's copy of tied embeddings).
  std::map<int, std::string> omitted;
  // A Llama-family model: the writer also exports its stages in Hugging Face's layout
  // (checkpoint/hf_export.h), in parts of at most hf_part_bytes.
  bool hf_export = false;
  uint64_t hf_part_bytes = 0;
  // training.checkpoint.async, and how long a checkpoint step waits for the previous
  // asynchronous write (and the task's end for the last one).
  bool async = false;
  absl::Duration write_timeout = absl::Minutes(30);
};

class CheckpointSteps {
 public:
  // `shards`: the task's ZeRO shards (every replica writes its shard files), or null.
  // `gathering` (placement.shard: parameters): the stages' parameters are gathered for each
  // checkpoint (its files and digests) and released after it, on every replica; or null.
  CheckpointSteps(CheckpointStepsOptions options, const std::map<int, model::StageModel*>& stages,
                  const torch::optim::Optimizer* optimizer, const StepReports* reports,
                  const ZeroShards* shards = nullptr, ParameterGathering* gathering = nullptr);

  // After a counted step that brought the timeline to `global_steps` steps (`requested`: one of
  // the requested checkpoint steps): writes the checkpoint when due and lists its files in
  // `report`.
  absl::Status AfterStep(int64_t global_steps, bool requested, v1::ReportStepRequest* report);

  // A checkpoint of the position the task holds at (`global_steps`; `task_step`: the report's
  // step, the task's last counted step), sent in a checkpoint_only report.
  // FAILED_PRECONDITION naming the rank when the job has no training.checkpoint.dir.
  absl::Status AtHold(int64_t global_steps, int64_t task_step);

  // Waits for the asynchronous write in flight (its files reported); its error, if any. Call
  // before the task ends.
  absl::Status Drain();

  // Whether this rank writes the stage files from now on (CheckpointStepsOptions::writer): the
  // data-parallel group's rank 0 does, which changes when replicas carry on without replica 0
  // (replica_membership.h). Between steps, on the task's thread.
  void SetWriter(bool writer) { writer_ = writer; }

 private:
  // Writes every stage of the rank after `global_steps` steps: now, listing the files in
  // `report`, or (async) in the background, sending them in a checkpoint_only report of the
  // report's step once durable.
  absl::Status Write(int64_t global_steps, v1::ReportStepRequest* report, bool async);
  // The rank's files after `global_steps` steps copied: its shard files, then (writer) each
  // stage's training state and export.
  absl::StatusOr<std::vector<StateSnapshot>> Snapshot(int64_t global_steps) const;
  // Writes the snapshots (and the Hugging Face export of each stage); their files. Touches only
  // the snapshots and constant options: runs on the background writer's thread too.
  absl::StatusOr<std::vector<v1::StageCheckpointFile>> WriteAll(
      const std::vector<StateSnapshot>& snapshots) const;

  // The digests of the stages' parameters, into `report`.
  void AddDigests(v1::ReportStepRequest* report) const;
  // Runs `write` with every stage's parameters whole (gathered first with gathering_, released
  // after); the gather's error, else write's.
  absl::Status WithWholeParameters(const std::function<absl::Status()>& write);

  // options_.omitted's entry for `stage`, or "".
  std::string Omitted(int stage) const {
    auto it = options_.omitted.find(stage);
    return it == options_.omitted.end() ? std::string() : it->second;
  }

  const CheckpointStepsOptions options_;
  const std::string& dir_ = options_.dir;
  bool writer_ = options_.writer;  // the task's thread's (SetWriter)
  const std::map<int, model::StageModel*>& stages_;
  const torch::optim::Optimizer* optimizer_;
  const StepReports* reports_;
  const ZeroShards* shards_;
  ParameterGathering* const gathering_;
  // The global step of the latest checkpoint this task wrote.
  int64_t last_ = -1;
  // STAGECOACH_FAULT_CHECKPOINT_STALL_MS.
  const absl::Duration stall_;
  BackgroundWriter background_;
};

}  // namespace stagecoach::runtime
