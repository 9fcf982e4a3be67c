#include "client/commands.h"

#include <unistd.h>

#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/rpc/channel.h"
#include "common/rpc/time_conversion.h"

namespace stagecoach::client {
namespace {

bool IsTerminal(std::ostream& s) {
  return (&s == &std::cout && isatty(STDOUT_FILENO)) || (&s == &std::cerr && isatty(STDERR_FILENO));
}

std::string ProgressBar(int64_t done, int64_t total, int width) {
  const int filled = total > 0 ? static_cast<int>(width * done / total) : 0;
  return absl::StrCat("[", std::string(filled, '#'), std::string(width - filled, '.'), "]");
}

std::string FormatEta(double seconds) {
  if (seconds < 0 || seconds > 1e7) return "?";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%dh%02dm", s / 3600, (s / 60) % 60);
}

}  // namespace

Commands::Commands(ClientOptions options, std::ostream& out, std::ostream& err)
    : options_(std::move(options)),
      out_(out),
      err_(err),
      stub_(v1::CoordinatorService::NewStub(rpc::MakeChannel(options_.coordinator))) {}

int Commands::RpcError(const grpc::Status& status, const std::string& what) {
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
    err_ << "stagectl: cannot reach the coordinator at " << options_.coordinator << " ("
         << status.error_message() << ")\n"
         << "Point stagectl at it with --coordinator HOST:PORT or STAGECOACH_COORDINATOR.\n";
  } else {
    err_ << "stagectl: " << what << ": " << status.error_message() << "\n";
  }
  return 1;
}

int Commands::Submit(const std::string& spec_path, bool wait) {
  std::ifstream in(spec_path);
  if (!in) {
    err_ << "stagectl: submit: cannot read spec file '" << spec_path << "'\n";
    return 1;
  }
  std::stringstream text;
  text << in.rdbuf();
  v1::SubmitJobRequest req;
  req.set_spec_yaml(text.str());
  req.set_spec_origin(spec_path);
  v1::SubmitJobResponse resp;
  grpc::ClientContext ctx;
  rpc::SetDeadline(&ctx, options_.timeout);
  grpc::Status status = stub_->SubmitJob(&ctx, req, &resp);
  if (!status.ok()) {
    if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
      err_ << "stagectl: submit: the coordinator refused " << spec_path << ":\n"
           << status.error_message() << "\n";
      return 1;
    }
    return RpcError(status, "submit");
  }
  out_ << resp.job_id() << std::endl;
  if (!wait) return 0;
  return Follow(resp.job_id(), err_);
}

int Commands::List() {
  v1::ListJobsResponse resp;
  grpc::ClientContext ctx;
  rpc::SetDeadline(&ctx, options_.timeout);
  grpc::Status status = stub_->ListJobs(&ctx, {}, &resp);
  if (!status.ok()) return RpcError(status, "list");
  std::vector<v1::Job> jobs(resp.jobs().begin(), resp.jobs().end());
  if (options_.format == OutputFormat::kTable) {
    out_ << JobsTable(jobs);
    return 0;
  }
  nlohmann::json all = nlohmann::json::array();
  for (const auto& j : jobs) all.push_back(JobJson(j));
  out_ << (options_.format == OutputFormat::kJson ? all.dump(2) + "\n" : ToYaml(all));
  return 0;
}

int Commands::Status(const std::string& job_id) {
  v1::GetJobRequest req;
  req.set_job_id(job_id);
  v1::GetJobResponse resp;
  grpc::ClientContext ctx;
  rpc::SetDeadline(&ctx, options_.timeout);
  grpc::Status status = stub_->GetJob(&ctx, req, &resp);
  if (!status.ok()) return RpcError(status, absl::StrCat("status ", job_id));
  switch (options_.format) {
    case OutputFormat::kTable:
      out_ << JobDetails(resp.job());
      break;
    case OutputFormat::kJson:
      out_ << JobJson(resp.job()).dump(2) << "\n";
      break;
    case OutputFormat::kYaml:
      out_ << ToYaml(JobJson(resp.job()));
      break;
  }
  return 0;
}

int Commands::Follow(const std::string& job_id, std::ostream& progress) {
  const bool tty = IsTerminal(progress);
  v1::WatchJobRequest req;
  req.set_job_id(job_id);
  int64_t next = 0;
  v1::JobState final_state = v1::JOB_STATE_UNSPECIFIED;
  std::string final_reason;
  bool bar_open = false;
  // A stream can break (coordinator restart, network); resume from the last event seen.
  for (int attempt = 0; attempt < 5 && final_state == v1::JOB_STATE_UNSPECIFIED; ++attempt) {
    grpc::ClientContext ctx;  // no deadline: a job runs as long as it runs
    req.set_from_sequence(next);
    auto reader = stub_->WatchJob(&ctx, req);
    v1::JobEvent event;
    while (reader->Read(&event)) {
      attempt = 0;
      next = event.sequence() + 1;
      if (event.has_state_change()) {
        const auto& change = event.state_change();
        if (bar_open) progress << "\n";
        bar_open = false;
        progress << job_id << " " << StateName(change.state());
        if (!change.reason().empty()) progress << ": " << change.reason();
        progress << std::endl;
        if (change.state() == v1::JOB_STATE_SUCCEEDED || change.state() == v1::JOB_STATE_FAILED ||
            change.state() == v1::JOB_STATE_CANCELLED) {
          final_state = change.state();
          final_reason = change.reason();
        }
      } else if (event.has_step_completed()) {
        const auto& step = event.step_completed();
        const int64_t done = step.step() + 1;
        const double step_seconds = absl::ToDoubleSeconds(rpc::FromProtoDuration(step.step_time()));
        const std::string line = absl::StrFormat(
            "step %d/%d  loss %.6f  %.0f samples/s  %.3fs/step  ETA %s", done, step.steps_total(),
            step.loss(), step.samples_per_second(), step_seconds,
            FormatEta(step_seconds * static_cast<double>(step.steps_total() - done)));
        if (tty) {
          progress << "\r" << ProgressBar(done, step.steps_total(), 30) << " " << line << "\x1b[K"
                   << std::flush;
          bar_open = true;
        } else {
          progress << line << std::endl;
        }
      }
    }
    grpc::Status status = reader->Finish();
    if (final_state != v1::JOB_STATE_UNSPECIFIED) break;
    if (!status.ok()) {
      if (status.error_code() != grpc::StatusCode::UNAVAILABLE || attempt == 4) {
        return RpcError(status, absl::StrCat("watch ", job_id));
      }
      usleep(500 * 1000);
    }
  }
  if (bar_open) progress << "\n";
  if (final_state == v1::JOB_STATE_SUCCEEDED) return 0;
  if (final_state == v1::JOB_STATE_UNSPECIFIED) {
    err_ << "stagectl: watch " << job_id << ": the event stream ended before the job did\n";
    return 1;
  }
  err_ << "stagectl: " << job_id << " " << StateName(final_state) << ": " << final_reason << "\n";
  return 1;
}

int Commands::Watch(const std::string& job_id) { return Follow(job_id, out_); }

int Commands::Cancel(const std::string& job_id) {
  v1::CancelJobRequest req;
  req.set_job_id(job_id);
  v1::CancelJobResponse resp;
  grpc::ClientContext ctx;
  rpc::SetDeadline(&ctx, options_.timeout);
  grpc::Status status = stub_->CancelJob(&ctx, req, &resp);
  if (!status.ok()) return RpcError(status, absl::StrCat("cancel ", job_id));
  out_ << resp.job().id() << " " << StateName(resp.job().state()) << "\n";
  return 0;
}

int Commands::Workers() {
  v1::ListWorkersResponse resp;
  grpc::ClientContext ctx;
  rpc::SetDeadline(&ctx, options_.timeout);
  grpc::Status status = stub_->ListWorkers(&ctx, {}, &resp);
  if (!status.ok()) return RpcError(status, "workers");
  std::vector<v1::WorkerInfo> workers(resp.workers().begin(), resp.workers().end());
  if (options_.format == OutputFormat::kTable) {
    out_ << WorkersTable(workers);
    return 0;
  }
  nlohmann::json all = nlohmann::json::array();
  for (const auto& w : workers) all.push_back(WorkerJson(w));
  out_ << (options_.format == OutputFormat::kJson ? all.dump(2) + "\n" : ToYaml(all));
  return 0;
}

}  // namespace stagecoach::client
