#include "coordinator/generation/generation.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <optional>
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
#include "common/util/logging.h"
#include "common/util/status_macros.h"
#include "coordinator/generation/pipeline_decoder.h"
#include "coordinator/generation/token_sampler.h"
#include "coordinator/jobs/job.h"

namespace stagecoach::coordinator {
namespace {

// What decoding needs of a job's model.
struct DecoderModel {
  int64_t vocab = 0;
  // The most positions a row may reach: the GPT's learned positions (model.builtin.seq), a
  // Llama-family model's max_position_embeddings.
  int64_t positions = 0;
};

// A job's model as a built-in decoder: INVALID_ARGUMENT naming the job for any other model.
absl::StatusOr<DecoderModel> DecoderOf(const v1::Job& job) {
  ASSIGN_OR_RETURN(const spec::JobSpec spec, spec::ReadJobSpec(job.spec_yaml(), job.id()));
  const std::optional<spec::BuiltinModel>& m = spec.model.builtin;
  if (m.has_value() && m->family == "gpt") return DecoderModel{m->vocab, m->seq};
  if (m.has_value() && m->family == "llama" && m->decoder.has_value()) {
    return DecoderModel{m->vocab, m->decoder->max_position_embeddings};
  }
  const std::string what =
      m.has_value() ? absl::StrCat("a built-in ", m->family)
                    : std::string(spec.model.torchscript.has_value() ? "a TorchScript model"
                                                                     : "not a decoder");
  return absl::InvalidArgumentError(
      absl::StrCat("job_id: job ", job.id(), "'s model is ", what,
                   "; generate needs a built-in gpt or llama (model.builtin.family, or model.hf)"));
}

// The request's prompts, one per row, checked against the model and the options.
absl::StatusOr<std::vector<std::vector<int32_t>>> CheckRequest(
    const v1::GenerateRequest& request, const GenerationOptions& options,
    const DecoderModel& model) {
  if (request.prompt().empty() == request.prompts().empty()) {
    return absl::InvalidArgumentError(
        request.prompt().empty() ? "prompt: needs at least one token (or prompts: rows of them)"
                                 : "prompt, prompts: give one of them, not both");
  }
  std::vector<std::vector<int32_t>> rows;
  if (!request.prompt().empty()) {
    rows.emplace_back(request.prompt().begin(), request.prompt().end());
  }
  for (const v1::TokenIds& p : request.prompts()) rows.emplace_back(p.ids().begin(), p.ids().end());
  if (static_cast<int64_t>(rows.size()) > options.max_rows) {
    return absl::InvalidArgumentError(absl::StrCat("prompts: at most ", options.max_rows,
                                                   " rows, got ", rows.size()));
  }
  for (size_t r = 0; r < rows.size(); ++r) {
    const std::string field =
        request.prompt().empty() ? absl::StrCat("prompts[", r, "]") : std::string("prompt");
    if (rows[r].empty()) return absl::InvalidArgumentError(field + ": needs at least one token");
    for (size_t i = 0; i < rows[r].size(); ++i) {
      const int32_t t = rows[r][i];
      if (t < 0 || t >= model.vocab) {
        return absl::InvalidArgumentError(absl::StrCat(field, ": token ", i, " is ", t,
                                                       ", outside the model's vocabulary [0, ",
                                                       model.vocab, ")"));
      }
    }
  }
  if (request.tokens() < 1 || request.tokens() > options.max_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokens: must be in [1, ", options.max_tokens, "], got ", request.tokens()));
  }
  RETURN_IF_ERROR(ValidateSamplingOptions(
      {request.temperature(), request.top_k(), static_cast<uint64_t>(request.seed())}));
  return rows;
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

}  // namespace

struct Generation::Target {
  std::string job_id;
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

namespace {

// One row of a generation: its prompt and tokens so far, and which of them the stages' caches
// hold: positions [0, held) are context[start, start + held).
struct RowState {
  std::vector<int32_t> context;
  size_t start = 0;
  int64_t held = 0;
};

// The next token's logits of every row, running what each row's caches lack: one new position
// after what they hold, or, for a row whose context outgrew the model's positions (or a first
// step), its last `positions` tokens from position 0. Rows with inputs of one length run
// together.
absl::StatusOr<std::vector<std::vector<float>>> NextLogits(PipelineDecoder& decoder,
                                                           std::vector<RowState>& rows,
                                                           int64_t positions, absl::Time deadline) {
  struct Group {
    std::vector<int64_t> rows, starts;
    std::vector<std::vector<int32_t>> tokens;
  };
  std::map<size_t, Group> by_length;
  for (size_t r = 0; r < rows.size(); ++r) {
    RowState& row = rows[r];
    const int64_t pending = static_cast<int64_t>(row.context.size() - row.start) - row.held;
    int64_t from = row.held;
    if (row.held + pending > positions) {  // slide: the last `positions` tokens, from 0
      row.start = row.context.size() - positions;
      row.held = 0;
      from = 0;
    }
    std::vector<int32_t> tokens(row.context.begin() + row.start + from, row.context.end());
    Group& g = by_length[tokens.size()];
    g.rows.push_back(static_cast<int64_t>(r));
    g.starts.push_back(from);
    g.tokens.push_back(std::move(tokens));
  }
  std::vector<std::vector<float>> logits(rows.size());
  for (auto& [length, g] : by_length) {
    ASSIGN_OR_RETURN(std::vector<std::vector<float>> out,
                     decoder.Step(g.rows, g.starts, g.tokens, deadline));
    for (size_t j = 0; j < g.rows.size(); ++j) {
      logits[g.rows[j]] = std::move(out[j]);
      rows[g.rows[j]].held = g.starts[j] + static_cast<int64_t>(length);
    }
  }
  return logits;
}

std::string SessionName(const std::string& job_id) {
  static std::atomic<uint64_t> next{0};
  return absl::StrCat("generate-", job_id, "-", absl::ToUnixMicros(absl::Now()), "-", next++);
}

}  // namespace

absl::Status Generation::Generate(const v1::GenerateRequest& request, absl::Duration timeout,
                                  const std::function<bool()>& caller_gone,
                                  const std::function<bool(const v1::GenerateResponse&)>& emit) {
  const absl::Time deadline = absl::Now() + timeout;
  ASSIGN_OR_RETURN(const v1::Job job,
                   jobs_->GetJob(request.job_id(), HistoryWindow{0, 0, 0, true}));
  ASSIGN_OR_RETURN(const DecoderModel model, DecoderOf(job));
  ASSIGN_OR_RETURN(const std::vector<std::vector<int32_t>> prompts,
                   CheckRequest(request, options_, model));
  ASSIGN_OR_RETURN(const Target target, ResolveTarget(job, deadline, caller_gone));
  std::string ending = "generate: cancelled before the end";
  auto cancel_helper = absl::MakeCleanup([&] {
    if (target.helper) (void)jobs_->CancelJob(target.job_id, ending);
  });
  ASSIGN_OR_RETURN(DecodeRoute route, jobs_->DecodeRouteOf(target.job_id));
  std::vector<RowState> rows(prompts.size());
  std::vector<TokenSampler> samplers;
  for (size_t r = 0; r < prompts.size(); ++r) {
    rows[r].context = prompts[r];
    // Row r draws with seed + r: a single prompt draws as it always did.
    samplers.emplace_back(SamplingOptions{request.temperature(), request.top_k(),
                                          static_cast<uint64_t>(request.seed()) + r});
  }
  {
    PipelineDecoder decoder(
        [this](const std::string& address, const v1::DecodeRequest& r, absl::Duration timeout) {
          return jobs_->Decode(address, r, timeout);
        },
        std::move(route), SessionName(target.job_id),
                            static_cast<int64_t>(rows.size()), model.positions, model.vocab);
    for (int i = 0; i < request.tokens(); ++i) {
      if (caller_gone && caller_gone()) {
        return absl::CancelledError("the caller of Generate went away");
      }
      ASSIGN_OR_RETURN(const std::vector<std::vector<float>> logits,
                       NextLogits(decoder, rows, model.positions, deadline));
      v1::GenerateResponse message;
      for (size_t r = 0; r < rows.size(); ++r) {
        const int token = samplers[r].Next(logits[r]);
        rows[r].context.push_back(token);
        message.add_tokens(token);
      }
      if (i == 0) {
        message.set_ran_on_job(target.job_id);
        message.set_weights_step(target.weights_step);
      }
      if (!emit(message)) return absl::CancelledError("the caller of Generate went away");
    }
    spdlog::info("generate on {}: {} tokens for each of {} rows; the stages' caches held {} bytes",
                 target.job_id, request.tokens(), rows.size(), decoder.cache_bytes());
  }
  ending = absl::StrCat("generate: done, ", request.tokens(), " tokens from job ", job.id());
  return absl::OkStatus();
}

}  // namespace stagecoach::coordinator
