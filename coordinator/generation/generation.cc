#include "coordinator/generation/generation.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/rpc/tensor_data.h"
#include "common/rpc/time_conversion.h"
#include "common/spec/spec_overrides.h"
#include "common/spec/hf_model_spec.h"
#include "common/spec/spec_parser.h"
#include "common/util/status_macros.h"
#include "coordinator/generation/token_sampler.h"
#include "coordinator/jobs/job.h"

namespace stagecoach::coordinator {
namespace {

// A job's spec as a built-in GPT: INVALID_ARGUMENT naming the job for any other model.
absl::StatusOr<spec::BuiltinModel> GptOf(const v1::Job& job) {
  ASSIGN_OR_RETURN(const spec::JobSpec spec, spec::ReadJobSpec(job.spec_yaml(), job.id()));
  if (!spec.model.builtin.has_value() || spec.model.builtin->family != "gpt") {
    const std::string what =
        spec.model.builtin.has_value()
            ? absl::StrCat("a built-in ", spec.model.builtin->family)
            : std::string(spec.model.torchscript.has_value() ? "a TorchScript model" : "no gpt");
    return absl::InvalidArgumentError(
        absl::StrCat("job_id: job ", job.id(), "'s model is ", what,
                     "; generate needs a built-in gpt (model.builtin.family: gpt)"));
  }
  return *spec.model.builtin;
}

absl::Status CheckRequest(const v1::GenerateRequest& request, const GenerationOptions& options,
                          const spec::BuiltinModel& gpt) {
  if (request.prompt().empty()) {
    return absl::InvalidArgumentError("prompt: needs at least one token");
  }
  for (int i = 0; i < request.prompt_size(); ++i) {
    const int32_t t = request.prompt(i);
    if (t < 0 || t >= gpt.vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "prompt: token ", i, " is ", t, ", outside the model's vocabulary [0, ", gpt.vocab, ")"));
    }
  }
  if (request.tokens() < 1 || request.tokens() > options.max_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokens: must be in [1, ", options.max_tokens, "], got ", request.tokens()));
  }
  return ValidateSamplingOptions(
      {request.temperature(), request.top_k(), static_cast<uint64_t>(request.seed())});
}

// The spec of the helper job that loads `job`'s checkpoint at `directory` for forward steps.
absl::StatusOr<std::string> HelperSpecYaml(const v1::Job& job, const std::string& directory) {
  spec::SpecOverrides overrides;
  overrides.set = {{"name", absl::StrCat(job.name(), "-generate")},
                   {"schedule.kind", "ForwardOnly"},
                   {"training.steps", "1"},
                   {"training.resume_from", directory}};
  overrides.remove = {
      "schedule.csv", "schedule.csv_format", "schedule.csv_text", "training.checkpoint", "data",
      "eval"};
  return spec::ApplySpecOverrides(job.spec_yaml(), job.id(), overrides);
}

// Rows of a forward step on `job`: one per microbatch of every replica.
int64_t RowsOf(const v1::Job& job) {
  return static_cast<int64_t>(std::max(1, job.microbatches())) * std::max(1, job.replicas());
}

}  // namespace

struct Generation::Target {
  std::string job_id;
  int64_t rows = 1;  // rows per step: the job's microbatches x replicas
  int64_t weights_step = 0;
  bool helper = false;
};

Generation::Generation(JobManager* jobs, GenerationOptions options)
    : jobs_(jobs), options_(options) {}

absl::StatusOr<Generation::Target> Generation::ResolveTarget(
    const v1::Job& job, absl::Time deadline, const std::function<bool()>& caller_gone) {
  if (job.state() == v1::JOB_STATE_PAUSED) {
    Target target;
    target.job_id = job.id();
    target.rows = RowsOf(job);
    target.weights_step = job.global_steps_done();
    return target;
  }
  if (job.state() == v1::JOB_STATE_SUCCEEDED) return StartHelper(job, deadline, caller_gone);
  return absl::FailedPreconditionError(
      absl::StrCat("job ", job.id(), " is ", JobStateName(job.state()),
                   "; generate needs a PAUSED job (its current weights: stagectl pause ", job.id(),
                   ") or a SUCCEEDED one (its final checkpoint)"));
}

absl::StatusOr<Generation::Target> Generation::StartHelper(
    const v1::Job& job, absl::Time deadline, const std::function<bool()>& caller_gone) {
  if (job.checkpoints().empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job.id(),
                     " finished without a checkpoint to generate from (set "
                     "training.checkpoint.dir, or pause a job and generate from it)"));
  }
  const v1::JobCheckpoint* latest = &job.checkpoints(0);
  for (const v1::JobCheckpoint& c : job.checkpoints()) {
    if (c.step() > latest->step()) latest = &c;
  }
  ASSIGN_OR_RETURN(const std::string yaml, HelperSpecYaml(job, latest->directory()));
  ASSIGN_OR_RETURN(const std::string helper_id,
                   jobs_->SubmitJob(yaml, absl::StrCat("generate from ", job.id()),
                                    /*start_paused=*/true, caller_gone));
  auto cancel = absl::MakeCleanup(
      [&] { (void)jobs_->CancelJob(helper_id, "generate: the helper job did not start"); });
  while (true) {
    ASSIGN_OR_RETURN(const v1::Job helper, jobs_->GetJob(helper_id, HistoryWindow{0, 0, 0, true}));
    if (helper.state() == v1::JOB_STATE_PAUSED) {
      std::move(cancel).Cancel();
      Target target;
      target.job_id = helper_id;
      target.rows = RowsOf(helper);
      target.weights_step = latest->step();
      target.helper = true;
      return target;
    }
    if (IsFinal(helper.state())) {
      return absl::AbortedError(absl::StrCat("job ", helper_id, " (loading ", job.id(),
                                             "'s checkpoint ", latest->directory(), ") ",
                                             JobStateName(helper.state()), ": ", helper.reason()));
    }
    if (caller_gone && caller_gone()) {
      return absl::CancelledError("the caller of Generate went away");
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "job ", helper_id, " (loading ", job.id(),
          "'s checkpoint) did not start in time; it was ", JobStateName(helper.state()),
          helper.reason().empty() ? "" : ": ", helper.reason()));
    }
    std::this_thread::sleep_for(absl::ToChronoMilliseconds(options_.poll_interval));
  }
}

absl::StatusOr<std::vector<float>> Generation::NextLogits(const Target& target,
                                                          const std::vector<int32_t>& window,
                                                          absl::Time deadline,
                                                          const std::function<bool()>& caller_gone,
                                                          int64_t vocab) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) {
    return absl::DeadlineExceededError(
        absl::StrCat("generate on job ", target.job_id, ": out of time"));
  }
  v1::StepJobRequest step;
  step.set_job_id(target.job_id);
  step.set_forward_only(true);
  *step.mutable_inputs() = WindowRows(window, target.rows);
  ASSIGN_OR_RETURN(const v1::StepJobResponse out, jobs_->StepJob(step, left, caller_gone));
  return LastPositionLogits(out.outputs(), static_cast<int64_t>(window.size()), vocab,
                            target.job_id);
}

absl::Status Generation::Generate(const v1::GenerateRequest& request, absl::Duration timeout,
                                  const std::function<bool()>& caller_gone,
                                  const std::function<bool(const v1::GenerateResponse&)>& emit) {
  const absl::Time deadline = absl::Now() + timeout;
  ASSIGN_OR_RETURN(const v1::Job job,
                   jobs_->GetJob(request.job_id(), HistoryWindow{0, 0, 0, true}));
  ASSIGN_OR_RETURN(const spec::BuiltinModel gpt, GptOf(job));
  RETURN_IF_ERROR(CheckRequest(request, options_, gpt));
  ASSIGN_OR_RETURN(const Target target, ResolveTarget(job, deadline, caller_gone));
  std::string ending = "generate: cancelled before the end";
  auto cancel_helper = absl::MakeCleanup([&] {
    if (target.helper) (void)jobs_->CancelJob(target.job_id, ending);
  });
  TokenSampler sampler(
      {request.temperature(), request.top_k(), static_cast<uint64_t>(request.seed())});
  std::vector<int32_t> context(request.prompt().begin(), request.prompt().end());
  for (int i = 0; i < request.tokens(); ++i) {
    const size_t from =
        context.size() > static_cast<size_t>(gpt.seq) ? context.size() - gpt.seq : 0;
    const std::vector<int32_t> window(context.begin() + from, context.end());
    ASSIGN_OR_RETURN(const std::vector<float> logits,
                     NextLogits(target, window, deadline, caller_gone, gpt.vocab));
    const int token = sampler.Next(logits);
    context.push_back(token);
    v1::GenerateResponse message;
    message.add_tokens(token);
    if (i == 0) {
      message.set_ran_on_job(target.job_id);
      message.set_weights_step(target.weights_step);
    }
    if (!emit(message)) return absl::CancelledError("the caller of Generate went away");
  }
  ending = absl::StrCat("generate: done, ", request.tokens(), " tokens from job ", job.id());
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> LastPositionLogits(const v1::TensorData& outputs, int64_t window,
                                                      int64_t vocab, const std::string& job_id) {
  RETURN_IF_ERROR(rpc::ValidateTensorData(outputs, "outputs"));
  const bool f32 = outputs.dtype() == "float32", f64 = outputs.dtype() == "float64";
  if ((!f32 && !f64) || outputs.shape_size() != 3 || outputs.shape(0) < 1 ||
      outputs.shape(1) != window || outputs.shape(2) != vocab) {
    return absl::InternalError(
        absl::StrCat("job ", job_id, "'s last stage returned ", rpc::DescribeTensorData(outputs),
                     ", not float logits [rows, ", window, ", ", vocab, "]"));
  }
  std::vector<float> logits(vocab);
  const int64_t first = (window - 1) * vocab;  // row 0, position window - 1
  const char* data = outputs.data().data();
  if (f32) {
    std::memcpy(logits.data(), data + first * 4, vocab * 4);
  } else {
    for (int64_t v = 0; v < vocab; ++v) {
      double x;
      std::memcpy(&x, data + (first + v) * 8, 8);
      logits[v] = static_cast<float>(x);
    }
  }
  return logits;
}

v1::TensorData WindowRows(const std::vector<int32_t>& window, int64_t rows) {
  v1::TensorData out;
  out.set_dtype("int64");
  out.add_shape(rows);
  out.add_shape(static_cast<int64_t>(window.size()));
  std::string bytes;
  bytes.reserve(rows * window.size() * 8);
  for (int64_t r = 0; r < rows; ++r) {
    for (int32_t t : window) {
      const int64_t v = t;
      bytes.append(reinterpret_cast<const char*>(&v), 8);
    }
  }
  out.set_data(std::move(bytes));
  return out;
}

}  // namespace stagecoach::coordinator
