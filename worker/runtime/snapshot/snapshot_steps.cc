#include "worker/runtime/snapshot/snapshot_steps.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/rpc/time_conversion.h"
#include "common/util/logging.h"
#include "common/util/sha256.h"
#include "common/util/status_macros.h"
#include "worker/runtime/checkpoint/checkpoint.h"

namespace stagecoach::runtime {

std::vector<int> SnapshotSenders(const std::vector<int>& holders, int rank) {
  std::vector<int> senders;
  for (int r = 0; r < static_cast<int>(holders.size()); ++r) {
    if (r != rank && holders[r] == rank) senders.push_back(r);
  }
  return senders;
}

SnapshotStepsOptions SnapshotOptionsOf(const v1::TaskAssignment& task, const std::string& worker_id,
                                       int64_t every_steps) {
  SnapshotStepsOptions options;
  options.worker_id = worker_id;
  options.job_id = task.job_id();
  options.attempt = task.attempt();
  options.rank = task.rank();
  options.every_steps = every_steps;
  const std::vector<int> holders(task.snapshot_holders().begin(), task.snapshot_holders().end());
  if (task.rank() < static_cast<int>(holders.size())) options.holder = holders[task.rank()];
  options.holds_for = SnapshotSenders(holders, task.rank());
  options.timeout = std::max(absl::Minutes(5), rpc::FromProtoDuration(task.comm_timeout()));
  return options;
}

SnapshotSteps::SnapshotSteps(SnapshotStepsOptions options,
                             const std::map<int, model::StageModel*>& stages,
                             const torch::optim::Optimizer* optimizer, SnapshotStore* store,
                             transport::Transport* transport, SnapshotReporter report)
    : options_(std::move(options)),
      stages_(stages),
      optimizer_(optimizer),
      store_(store),
      transport_(transport),
      report_(std::move(report)),
      background_(absl::StrCat("rank ", options_.rank, "'s in-memory snapshot"), options_.timeout) {
}

absl::Status SnapshotSteps::AfterStep(int64_t global_steps) {
  if (options_.every_steps <= 0 || global_steps % options_.every_steps != 0) {
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(background_.Drain());  // one copy held at a time
  std::vector<StateSnapshot> copies;
  for (const auto& [s, stage] : stages_) {
    auto omitted = options_.omitted.find(s);
    ASSIGN_OR_RETURN(copies.emplace_back(),
                     SnapshotState(s, global_steps, StageStateFileName(s), false,
                                   stage->NamedParameters(), stage->NamedBuffers(), *optimizer_,
                                   /*data_position=*/global_steps,
                                   omitted == options_.omitted.end() ? "" : omitted->second));
  }
  return background_.Start([this, global_steps, copies = std::move(copies)]() {
    return Exchange(global_steps, copies);
  });
}

absl::Status SnapshotSteps::Exchange(int64_t global_steps,
                                     const std::vector<StateSnapshot>& copies) {
  const absl::Time start = absl::Now();
  std::vector<SnapshotFile> own;
  for (const StateSnapshot& copy : copies) {
    ASSIGN_OR_RETURN(std::vector<char> bytes, PickleSnapshot(copy));
    SnapshotFile& file = own.emplace_back();
    file.rank = options_.rank;
    file.entry.set_stage(copy.stage);
    file.entry.set_file(copy.file_name);
    file.entry.set_size_bytes(static_cast<int64_t>(bytes.size()));
    file.entry.set_sha256(Sha256Hex(absl::string_view(bytes.data(), bytes.size())));
    file.bytes = std::make_shared<const std::vector<char>>(std::move(bytes));
    store_->Put(options_.job_id, global_steps, file.rank, file.entry, file.bytes);
  }
  if (transport_ != nullptr && (options_.holder >= 0 || !options_.holds_for.empty())) {
    std::map<int, std::vector<SnapshotFile>> outgoing;
    if (options_.holder >= 0 && options_.holder != options_.rank) {
      outgoing[options_.holder] = own;
    }
    ASSIGN_OR_RETURN(auto received, ExchangeSnapshotFiles(*transport_, outgoing, options_.holds_for,
                                                          options_.timeout));
    for (const auto& [q, files] : received) {
      for (const SnapshotFile& f : files) {
        store_->Put(options_.job_id, global_steps, f.rank, f.entry, f.bytes);
      }
    }
  }
  if (background_.abandoned()) return absl::OkStatus();
  const int held = ReportHeld(global_steps);
  spdlog::info("{} rank {}: in-memory snapshot after step {} ({} ranks' files held, {:.3f} s)",
               options_.job_id, options_.rank, global_steps, held,
               absl::ToDoubleSeconds(absl::Now() - start));
  return absl::OkStatus();
}

absl::Status SnapshotSteps::Drain() { return background_.Drain(); }

int SnapshotSteps::ReportHeld(int64_t global_steps) const {
  v1::ReportSnapshotRequest report;
  report.set_worker_id(options_.worker_id);
  report.set_job_id(options_.job_id);
  report.set_attempt(options_.attempt);
  report.set_step(global_steps);
  for (v1::SnapshotCopy& copy : store_->Held(options_.job_id, global_steps)) {
    *report.add_held() = std::move(copy);
  }
  if (report_) {
    const absl::Status sent = report_(report);
    if (!sent.ok()) {
      spdlog::warn("{} rank {}: reporting the snapshot after step {}: {}", options_.job_id,
                   options_.rank, global_steps, sent.message());
    }
  }
  return report.held_size();
}

}  // namespace stagecoach::runtime
