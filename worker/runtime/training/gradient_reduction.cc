#include "worker/runtime/training/gradient_reduction.h"

#include <torch/torch.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/util/status_macros.h"
#include "worker/runtime/training/replica_buffers.h"

namespace stagecoach::runtime {
namespace {

absl::StatusOr<collectives::DataType> CollectiveType(const torch::Tensor& t, int stage) {
  switch (t.scalar_type()) {
    case torch::kFloat32:
      return collectives::DataType::kFloat32;
    case torch::kFloat64:
      return collectives::DataType::kFloat64;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("gradient reduction of stage ", stage, ": gradients of dtype ",
                       c10::toString(t.scalar_type()), " cannot be reduced (float32 or float64)"));
  }
}

}  // namespace

GradientReducer::GradientReducer(GradientReductionOptions options, collectives::Collectives* group,
                                 std::map<int, model::StageModel*> stages, Executor* comm)
    : options_(options), group_(group), stages_(std::move(stages)), comm_(comm) {}

GradientReducer::~GradientReducer() { scope_.Close(); }

void GradientReducer::SetGroup(collectives::Collectives* group, int slices) {
  {
    // A reduction cut short by the old group's abort may still be returning on the
    // communication thread: it must be done with the old group before the group changes.
    absl::MutexLock lock(&mu_);
    auto done = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return outstanding_ == 0; };
    mu_.AwaitWithTimeout(absl::Condition(&done), options_.timeout);
  }
  group_ = group;
  slices_ = slices;
}

void GradientReducer::BeginStep(absl::Time step_start, bool deferred) {
  started_.clear();
  deferred_ = deferred;
  step_start_ = step_start;
  stats_at_start_ = group_->stats();
  absl::MutexLock lock(&mu_);
  buckets_.clear();
  error_ = absl::OkStatus();
}

void GradientReducer::Launch(int stage) {
  {
    absl::MutexLock lock(&mu_);
    ++outstanding_;
  }
  comm_->Run(scope_.Wrap([this, stage] { ReduceStage(stage); }));
}

void GradientReducer::StageReady(int stage) {
  if (!options_.overlap || deferred_ || stages_.count(stage) == 0 ||
      !started_.insert(stage).second) {
    return;
  }
  Launch(stage);
}

void GradientReducer::ReduceStage(int stage) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> bucket;
  int64_t bucket_bytes = 0;
  absl::Status status;
  try {
    if (options_.shards != nullptr) {
      status = ReduceScatterStage(stage);
      absl::MutexLock lock(&mu_);
      error_.Update(status);
      --outstanding_;
      return;
    }
    for (torch::Tensor& p : stages_.at(stage)->Parameters()) {
      const torch::Tensor& g = p.grad();
      if (!g.defined()) continue;
      const int64_t bytes = g.numel() * static_cast<int64_t>(g.element_size());
      const bool other_dtype = !bucket.empty() && bucket.front().scalar_type() != g.scalar_type();
      if (!bucket.empty() && (other_dtype || bucket_bytes + bytes > options_.bucket_bytes)) {
        status.Update(ReduceBucket(stage, bucket));
        bucket.clear();
        bucket_bytes = 0;
      }
      bucket.push_back(g);
      bucket_bytes += bytes;
    }
    if (!bucket.empty()) status.Update(ReduceBucket(stage, bucket));
  } catch (const c10::Error& e) {
    status = absl::InternalError(
        absl::StrCat("gradient reduction of stage ", stage, ": ", e.what_without_backtrace()));
  }
  absl::MutexLock lock(&mu_);
  error_.Update(status);
  --outstanding_;
}

absl::Status GradientReducer::ReduceBucket(int stage, const std::vector<torch::Tensor>& grads) {
  {
    absl::MutexLock lock(&mu_);
    if (!error_.ok()) return absl::OkStatus();  // the step failed already; Finish reports it
  }
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(const collectives::DataType dtype, CollectiveType(grads.front(), stage));
  int64_t numel = 0;
  for (const torch::Tensor& g : grads) numel += g.numel();
  const torch::Device device =
      group_->takes_device_memory() ? grads.front().device() : torch::Device(torch::kCPU);
  torch::Tensor flat =
      torch::empty({numel}, torch::TensorOptions().dtype(grads.front().dtype()).device(device));
  int64_t offset = 0;
  for (const torch::Tensor& g : grads) {
    flat.narrow(0, offset, g.numel()).copy_(g.reshape(-1));
    offset += g.numel();
  }
  const bool mean = slices_ == 0 || slices_ == group_->size();
  absl::Status reduced = group_->AllReduce(
      flat.data_ptr(), numel, dtype,
      mean ? collectives::ReduceOp::kMean : collectives::ReduceOp::kSum, options_.timeout);
  if (!reduced.ok()) {
    group_->Abort();
    return absl::Status(reduced.code(), absl::StrCat("gradient reduction of stage ", stage, ": ",
                                                     reduced.message()));
  }
  if (!mean) flat.div_(static_cast<double>(slices_));
  offset = 0;
  for (torch::Tensor g : grads) {
    g.copy_(flat.narrow(0, offset, g.numel()).view_as(g));
    offset += g.numel();
  }
  const int64_t bytes = numel * static_cast<int64_t>(flat.element_size());
  absl::MutexLock lock(&mu_);
  buckets_.push_back(BucketTiming{stage, bytes, start - step_start_, absl::Now() - step_start_});
  return absl::OkStatus();
}

absl::Status GradientReducer::ReduceScatterStage(int stage) {
  {
    absl::MutexLock lock(&mu_);
    if (!error_.ok()) return absl::OkStatus();
  }
  const absl::Time start = absl::Now();
  const torch::Tensor& shard = options_.shards->shard(stage);
  if (!shard.defined()) return absl::OkStatus();  // a stage without parameters
  ASSIGN_OR_RETURN(const collectives::DataType dtype, CollectiveType(shard, stage));
  const torch::Device device =
      group_->takes_device_memory() ? shard.device() : torch::Device(torch::kCPU);
  torch::Tensor flat = options_.shards->FlatGradients(stage, device);
  torch::Tensor mine = torch::empty({shard.numel()}, flat.options());
  absl::Status reduced =
      group_->ReduceScatter(flat.data_ptr(), mine.data_ptr(), shard.numel(), dtype,
                            collectives::ReduceOp::kMean, options_.timeout);
  if (!reduced.ok()) {
    group_->Abort();
    return absl::Status(reduced.code(), absl::StrCat("gradient reduce-scatter of stage ", stage,
                                                     ": ", reduced.message()));
  }
  options_.shards->SetShardGradient(stage, mine);
  const int64_t bytes = flat.numel() * static_cast<int64_t>(flat.element_size());
  absl::MutexLock lock(&mu_);
  buckets_.push_back(BucketTiming{stage, bytes, start - step_start_, absl::Now() - step_start_});
  return absl::OkStatus();
}

absl::Status GradientReducer::GatherParameters(ReductionReport& report) {
  // Sharded parameters are gathered at their next UNSHARD instead (parameter_gathering.h).
  if (options_.shards == nullptr || options_.shards->level() == spec::ShardLevel::kParameters) {
    return absl::OkStatus();
  }
  const collectives::CollectiveStats before = group_->stats();
  absl::Status gathered = options_.shards->GatherParameters(*group_, options_.timeout);
  if (!gathered.ok()) {
    group_->Abort();
    return gathered;
  }
  const collectives::CollectiveStats after = group_->stats();
  report.gather_bytes_sent = after.bytes_sent - before.bytes_sent;
  report.bytes_sent += report.gather_bytes_sent;
  report.bytes_received += after.bytes_received - before.bytes_received;
  return absl::OkStatus();
}

absl::Status GradientReducer::BroadcastBuffers() {
  absl::Status sent = BroadcastReplicaBuffers(*group_, stages_, options_.timeout);
  if (!sent.ok()) group_->Abort();
  return sent;
}

absl::StatusOr<ReductionReport> GradientReducer::Finish() {
  const absl::Time entered = absl::Now();
  for (const auto& [stage, model] : stages_) {
    if (!started_.insert(stage).second) continue;
    if (options_.overlap) {
      Launch(stage);
    } else {
      {
        absl::MutexLock lock(&mu_);
        ++outstanding_;
      }
      ReduceStage(stage);
    }
  }
  ReductionReport report;
  absl::Status error;
  {
    absl::MutexLock lock(&mu_);
    auto done = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return outstanding_ == 0; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&done), options_.timeout)) {
      error_.Update(absl::DeadlineExceededError(absl::StrCat(
          "gradient reduction: ", outstanding_, " stage(s) not reduced after ",
          absl::FormatDuration(options_.timeout), " (a replica of this rank is late or lost)")));
    }
    error = error_;
    report.buckets = buckets_;
  }
  if (!error.ok()) {
    group_->Abort();
    return error;
  }
  report.waited = absl::Now() - entered;
  const collectives::CollectiveStats after = group_->stats();
  report.bytes_sent = after.bytes_sent - stats_at_start_.bytes_sent;
  report.bytes_received = after.bytes_received - stats_at_start_.bytes_received;
  const collectives::CollectiveOverlap overlap =
      collectives::OverlapOf(report.buckets, report.waited);
  report.span = overlap.span;
  report.hidden_ratio = overlap.hidden_ratio;
  return report;
}

void GradientReducer::Abort() { group_->Abort(); }

}  // namespace stagecoach::runtime
