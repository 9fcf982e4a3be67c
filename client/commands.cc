#include "client/commands.h"
#include "client/message_size.h"

#include <sys/ioctl.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "client/npy.h"
#include "client/spec_text.h"
#include "client/render/render_diagnosis.h"
#include "client/render/watch.h"
#include "common/rpc/channel.h"
#include "common/rpc/tensor_data.h"
#include "common/rpc/time_conversion.h"
#include "common/spec/spec_overrides.h"
#include "common/util/byte_size.h"
#include "common/util/sha256.h"
#include "common/util/utf8.h"

namespace stagecoach::client {
namespace {

bool IsTerminal(std::ostream& s) {
  return (&s == &std::cout && isatty(STDOUT_FILENO)) || (&s == &std::cerr && isatty(STDERR_FILENO));
}

// Columns of the terminal behind `s` (80 when unknown).
int TerminalWidth(std::ostream& s) {
  const int fd = &s == &std::cerr ? STDERR_FILENO : STDOUT_FILENO;
  winsize size{};
  if (ioctl(fd, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  return 80;
}

// An artifact uri of the right form, to try spec edits on before the real one is known.
std::string ArtifactUriPlaceholder() { return "artifact:" + std::string(64, '0'); }

}  // namespace

Commands::Commands(ClientOptions options, std::ostream& out, std::ostream& err)
    : options_(std::move(options)),
      out_(out),
      err_(err),
      stub_(v1::CoordinatorService::NewStub(
          rpc::MakeChannel(options_.coordinator, options_.security))) {}

int ReportRpcError(std::ostream& err, const std::string& coordinator, const grpc::Status& status,
                   const std::string& what) {
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
    err << "stagectl: cannot reach the coordinator at " << coordinator << " ("
        << status.error_message() << ")\n"
        << "Point stagectl at it with --coordinator HOST:PORT or STAGECOACH_COORDINATOR.\n";
  } else if (std::optional<std::string> hint = MessageLimitHint(status.error_message())) {
    err << "stagectl: " << what << ": " << *hint << "\n";
  } else if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
    err << "stagectl: " << what << ": the coordinator at " << coordinator
        << " does not implement this call"
        << (status.error_message().empty() ? "" : absl::StrCat(" (", status.error_message(), ")"))
        << "; it may be older than this stagectl\n";
  } else {
    err << "stagectl: " << what << ": " << status.error_message() << "\n";
  }
  return 1;
}

int Commands::RpcError(const grpc::Status& status, const std::string& what) {
  return ReportRpcError(err_, options_.coordinator, status, what);
}

int Commands::UploadFile(const std::string& command, const std::string& path,
                         const std::string& flag, std::string* uri) {
  absl::string_view id = path;
  if (absl::ConsumePrefix(&id, "artifact:")) {  // uploaded before: use as it is
    if (!IsSha256Hex(id)) {
      err_ << "stagectl: " << command << ": " << flag << ": '" << path
           << "' is not an artifact uri (artifact: followed by 64 lowercase hex digits)\n";
      return 2;
    }
    *uri = path;
    return 0;
  }
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) {
    err_ << "stagectl: " << command << ": " << flag << ": cannot read '" << path
         << "': " << (std::filesystem::exists(path, error) ? "not a regular file" : "no such file")
         << "\n";
    return 2;
  }
  const auto size = static_cast<int64_t>(std::filesystem::file_size(path, error));
  absl::StatusOr<std::string> sha256 = Sha256OfFile(path);
  std::ifstream in(path, std::ios::binary);
  if (error || !sha256.ok() || !in) {
    err_ << "stagectl: " << command << ": " << flag << ": cannot read '" << path << "'"
         << (sha256.ok() ? "" : absl::StrCat(": ", sha256.status().message())) << "\n";
    return 2;
  }
  const std::string name = std::filesystem::path(path).filename().string();
  v1::UploadArtifactResponse resp;
  grpc::ClientContext ctx;
  // Allows 4 MiB/s on top of the usual bound.
  rpc::SetDeadline(&ctx, options_.timeout + absl::Seconds(size / (4 << 20)));
  auto writer = stub_->UploadArtifact(&ctx, &resp);
  v1::UploadArtifactRequest msg;
  v1::ArtifactHeader* header = msg.mutable_header();
  header->set_name(name);
  header->set_size_bytes(size);
  header->set_sha256(*sha256);
  bool open = writer->Write(msg);
  std::string buffer(kUploadChunkBytes, '\0');
  int64_t sent = 0;
  while (open && sent < size) {
    in.read(buffer.data(), std::min<int64_t>(kUploadChunkBytes, size - sent));
    if (in.gcount() <= 0) break;  // the file shrank: the coordinator reports the size
    msg.set_chunk(buffer.data(), static_cast<size_t>(in.gcount()));
    open = writer->Write(msg);
    sent += in.gcount();
  }
  if (open) writer->WritesDone();
  grpc::Status status = writer->Finish();
  if (!status.ok()) {
    if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
        status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      err_ << "stagectl: " << command << ": the coordinator refused " << flag << " " << path << ": "
           << status.error_message() << "\n";
      return 1;
    }
    return RpcError(status, absl::StrCat(command, ": uploading ", path));
  }
  err_ << "uploaded " << name << " (" << util::FormatBytes(resp.size_bytes()) << ", "
       << resp.chunks() << (resp.chunks() == 1 ? " chunk" : " chunks") << ") as " << resp.uri()
       << std::endl;
  *uri = resp.uri();
  return 0;
}

int Commands::ReadSpec(const std::string& command, const std::string& spec_path,
                       const SubmitUploads& uploads, std::string* spec_yaml_out) {
  std::ifstream in(spec_path);
  if (!in) {
    err_ << "stagectl: " << command << ": cannot read spec file '" << spec_path << "'\n";
    return 1;
  }
  std::stringstream text;
  text << in.rdbuf();
  std::string spec_text = text.str();
  if (std::string bad = Utf8Problem(spec_text, absl::StrCat("spec file '", spec_path, "'"));
      !bad.empty()) {
    err_ << "stagectl: " << command << ": " << bad << "\n";
    return 1;
  }
  if (!uploads.model.empty() || !uploads.data.empty()) {
    if (!uploads.model.empty() && HasBuiltinModel(spec_text)) {
      err_ << "stagectl: " << command << ": --model: " << spec_path
           << " sets model.builtin; --model supplies model.torchscript instead (remove "
              "model.builtin from the spec)\n";
      return 2;
    }
    // Uploaded files replace the spec's own references: "artifact:<sha256>". A spec these
    // cannot be set in is reported before anything is uploaded.
    spec::SpecOverrides overrides;
    const std::string placeholder = ArtifactUriPlaceholder();
    if (!uploads.model.empty()) overrides.set.emplace_back("model.torchscript", placeholder);
    if (!uploads.data.empty()) overrides.set.emplace_back("data.path", placeholder);
    if (auto checked = spec::ApplySpecOverrides(spec_text, spec_path, overrides); !checked.ok()) {
      err_ << "stagectl: " << command << ": " << checked.status().message() << "\n";
      return 1;
    }
    overrides.set.clear();
    std::string uri;
    if (!uploads.model.empty()) {
      if (int rc = UploadFile(command, uploads.model, "--model", &uri); rc != 0) return rc;
      overrides.set.emplace_back("model.torchscript", uri);
    }
    if (!uploads.data.empty()) {
      if (int rc = UploadFile(command, uploads.data, "--data", &uri); rc != 0) return rc;
      overrides.set.emplace_back("data.path", uri);
    }
    absl::StatusOr<std::string> edited = spec::ApplySpecOverrides(spec_text, spec_path, overrides);
    if (!edited.ok()) {
      err_ << "stagectl: " << command << ": " << edited.status().message() << "\n";
      return 1;
    }
    spec_text = *std::move(edited);
  }
  // schedule.csv names a file on this machine: its contents travel with the spec.
  absl::StatusOr<std::string> spec_yaml = InlineScheduleCsv(spec_text, spec_path);
  if (!spec_yaml.ok()) {
    err_ << "stagectl: " << command << ": " << spec_yaml.status().message() << "\n";
    return 1;
  }
  if (std::string bad = Utf8Problem(*spec_yaml, "the spec with its schedule.csv file inlined");
      !bad.empty()) {
    err_ << "stagectl: " << command << ": " << bad << " (the schedule CSV file)\n";
    return 1;
  }
  *spec_yaml_out = *std::move(spec_yaml);
  return 0;
}

int Commands::Submit(const std::string& spec_path, bool wait, const SubmitUploads& uploads,
                     bool paused) {
  std::string spec_yaml;
  if (int rc = ReadSpec("submit", spec_path, uploads, &spec_yaml); rc != 0) return rc;
  v1::SubmitJobRequest req;
  req.set_spec_yaml(spec_yaml);
  req.set_spec_origin(spec_path);
  req.set_start_paused(paused);
  v1::SubmitJobResponse resp;
  // Planning a TorchScript model asks a worker to load (and, for split.policy profiled, time)
  // it first, bounded by the coordinator's inspection timeout (120 s by default).
  grpc::Status status = Call(&v1::CoordinatorService::Stub::SubmitJob, req, &resp,
                             options_.timeout + kSubmitInspectionAllowance);
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
  return Follow(resp.job_id(), err_, OutputFormat::kTable);
}

int Commands::List() {
  // The coordinator answers a page at a time; every page is fetched.
  std::vector<v1::Job> jobs;
  v1::ListJobsRequest req;
  do {
    v1::ListJobsResponse resp;
    grpc::Status status = Call(&v1::CoordinatorService::Stub::ListJobs, req, &resp);
    if (!status.ok()) return RpcError(status, "list");
    jobs.insert(jobs.end(), resp.jobs().begin(), resp.jobs().end());
    req.set_page_token(resp.next_page_token());
  } while (!req.page_token().empty());
  if (options_.format == OutputFormat::kTable) {
    out_ << JobsTable(jobs);
    return 0;
  }
  nlohmann::json all = nlohmann::json::array();
  for (const auto& j : jobs) all.push_back(JobJson(j));
  out_ << (options_.format == OutputFormat::kJson ? all.dump(2) + "\n" : ToYaml(all));
  return 0;
}

int Commands::Status(const std::string& job_id, const HistoryRequest& history) {
  v1::GetJobRequest req;
  req.set_job_id(job_id);
  req.set_history_all(history.all);
  req.set_history_from(history.from);
  req.set_history_limit(history.steps);
  v1::GetJobResponse resp;
  grpc::Status status = Call(&v1::CoordinatorService::Stub::GetJob, req, &resp);
  if (!status.ok()) return RpcError(status, absl::StrCat("status ", job_id));
  return Print(JobJson(resp.job()), JobDetails(resp.job()));
}

int Commands::Print(const nlohmann::json& json, const std::string& table) {
  out_ << Render(options_.format, json, table) << std::flush;
  return 0;
}

int Commands::Follow(const std::string& job_id, std::ostream& progress, OutputFormat format) {
  const bool live = format == OutputFormat::kTable && IsTerminal(progress);
  const absl::TimeZone zone = absl::LocalTimeZone();
  v1::WatchJobRequest req;
  req.set_job_id(job_id);
  int64_t next = 0;
  WatchState view;
  view.job_id = job_id;
  std::string final_reason;
  bool line_open = false;  // the live line is on screen, without its newline
  // A stream can break (coordinator restart, network); resume from the last event seen.
  for (int attempt = 0; attempt < 5 && !IsFinalState(view.state); ++attempt) {
    grpc::ClientContext ctx;  // no deadline: a job runs as long as it runs
    req.set_from_sequence(next);
    auto reader = stub_->WatchJob(&ctx, req);
    v1::JobEvent event;
    while (reader->Read(&event)) {
      attempt = 0;
      next = event.sequence() + 1;
      ApplyEvent(event, &view);
      if (event.has_state_change() && IsFinalState(event.state_change().state())) {
        final_reason = event.state_change().reason();
      }
      if (format == OutputFormat::kJson) {
        progress << EventJson(event).dump() << std::endl;
        continue;
      }
      if (format == OutputFormat::kYaml) {
        progress << "---\n" << ToYaml(EventJson(event)) << std::flush;
        continue;
      }
      if (!event.has_step_completed()) {
        if (line_open) progress << "\r\x1b[K";
        progress << NoticeLine(event, zone) << "\n";
        line_open = false;
      } else if (event.has_step_completed() && !live) {
        progress << StepLine(view) << "\n";
      }
      if (live && view.has_step && !IsFinalState(view.state)) {
        progress << "\r" << ProgressLine(view, TerminalWidth(progress)) << "\x1b[K";
        line_open = true;
      }
      progress << std::flush;
    }
    grpc::Status status = reader->Finish();
    if (IsFinalState(view.state)) break;
    if (!status.ok()) {
      if (line_open) progress << "\n";
      line_open = false;
      if (status.error_code() != grpc::StatusCode::UNAVAILABLE || attempt == 4) {
        return RpcError(status, absl::StrCat("watch ", job_id));
      }
      usleep(500 * 1000);
    }
  }
  if (line_open) progress << "\n" << std::flush;
  if (view.state == v1::JOB_STATE_SUCCEEDED) return 0;
  if (!IsFinalState(view.state)) {
    err_ << "stagectl: watch " << job_id << ": the event stream ended before the job did\n";
    return 1;
  }
  err_ << "stagectl: " << job_id << " " << StateName(view.state) << ": " << final_reason << "\n";
  return 1;
}

int Commands::Watch(const std::string& job_id) { return Follow(job_id, out_, options_.format); }

int Commands::Infer(const std::string& spec_path, const std::string& input_path,
                    const std::string& out_path, absl::Duration timeout) {
  std::ifstream in(spec_path);
  if (!in) {
    err_ << "stagectl: infer: cannot read spec file '" << spec_path << "'\n";
    return 1;
  }
  std::stringstream text;
  text << in.rdbuf();
  auto inputs = ReadNpy(input_path);
  if (!inputs.ok()) {
    err_ << "stagectl: infer: " << inputs.status().message() << "\n";
    return 1;
  }
  if (std::string bad = Utf8Problem(text.str(), absl::StrCat("spec file '", spec_path, "'"));
      !bad.empty()) {
    err_ << "stagectl: infer: " << bad << "\n";
    return 1;
  }
  v1::InferRequest req;
  req.set_spec_yaml(text.str());
  req.set_spec_origin(spec_path);
  *req.mutable_inputs() = *std::move(inputs);
  *req.mutable_timeout() = rpc::ToProtoDuration(timeout);
  if (auto oversize = OversizeBatchError(req.ByteSizeLong(), req.inputs(), "INPUT", input_path)) {
    err_ << "stagectl: infer: " << *oversize << "\n";
    return 1;
  }
  v1::InferResponse resp;
  const absl::Time start = absl::Now();
  // The coordinator gives up (and cancels the job) at `timeout`; the margin lets its answer
  // arrive before the call's own deadline.
  grpc::Status status =
      Call(&v1::CoordinatorService::Stub::Infer, req, &resp, timeout + options_.timeout);
  if (!status.ok()) {
    if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
      err_ << "stagectl: infer: the coordinator refused " << spec_path << " with " << input_path
           << ":\n"
           << status.error_message() << "\n";
      return 1;
    }
    return RpcError(status, "infer");
  }
  const v1::TensorData& outputs = resp.outputs();
  if (absl::Status valid = rpc::ValidateTensorData(outputs, "outputs"); !valid.ok()) {
    err_ << "stagectl: infer: " << resp.job_id() << " returned " << valid.message() << "\n";
    return 1;
  }
  if (!out_path.empty()) {
    if (absl::Status written = WriteNpy(out_path, outputs); !written.ok()) {
      err_ << "stagectl: infer: " << written.message() << "\n";
      return 1;
    }
    err_ << absl::StrFormat("%s: %s written to %s (%.3fs)\n", resp.job_id(),
                            rpc::DescribeTensorData(outputs), out_path,
                            absl::ToDoubleSeconds(absl::Now() - start));
    out_ << resp.job_id() << std::endl;
    return 0;
  }
  switch (options_.format) {
    case OutputFormat::kTable:
      out_ << TensorSummary(resp.job_id(), outputs);
      break;
    case OutputFormat::kJson:
      out_ << TensorJson(resp.job_id(), outputs).dump(2) << "\n";
      break;
    case OutputFormat::kYaml:
      out_ << ToYaml(TensorJson(resp.job_id(), outputs));
      break;
  }
  return 0;
}

int Commands::Cancel(const std::string& job_id) {
  v1::CancelJobRequest req;
  req.set_job_id(job_id);
  v1::CancelJobResponse resp;
  grpc::Status status = Call(&v1::CoordinatorService::Stub::CancelJob, req, &resp);
  if (!status.ok()) return RpcError(status, absl::StrCat("cancel ", job_id));
  return Print({{"job_id", resp.job().id()}, {"state", StateName(resp.job().state())}},
               absl::StrCat(resp.job().id(), " ", StateName(resp.job().state()), "\n"));
}

int Commands::Workers() {
  v1::ListWorkersResponse resp;
  grpc::Status status =
      Call(&v1::CoordinatorService::Stub::ListWorkers, v1::ListWorkersRequest(), &resp);
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

int Commands::JobSchedule(const std::string& job_id, bool lowered, const std::string& out_path) {
  v1::GetJobScheduleRequest req;
  req.set_job_id(job_id);
  v1::GetJobScheduleResponse resp;
  grpc::Status status = Call(&v1::CoordinatorService::Stub::GetJobSchedule, req, &resp);
  if (!status.ok()) return RpcError(status, absl::StrCat("schedule --job ", job_id));
  std::string grid = lowered ? resp.lowered_grid() : resp.grid();
  if (!grid.empty() && grid.back() != '\n') grid += '\n';
  const std::string text = Render(options_.format, JobScheduleJson(job_id, resp), grid);
  if (out_path.empty()) {
    out_ << text << std::flush;
    return 0;
  }
  std::ofstream file(out_path, std::ios::binary | std::ios::trunc);
  file << text;
  file.close();
  if (!file) {
    err_ << "stagectl: schedule: --out: cannot write '" << out_path << "'\n";
    return 1;
  }
  return 0;
}

int Commands::Trace(const std::string& job_id, int64_t global_step, const std::string& out_path) {
  if (global_step < -1) {
    err_ << "stagectl: trace: --step: must be a global step >= 0, or -1 for the latest; got "
         << global_step << "\n";
    return 2;
  }
  if (out_path.empty()) {
    err_ << "stagectl: trace: --out: required (the Chrome trace JSON file to write)\n";
    return 2;
  }
  v1::GetStepTraceRequest req;
  req.set_job_id(job_id);
  req.set_global_step(global_step);
  v1::GetStepTraceResponse resp;
  grpc::Status status = Call(&v1::CoordinatorService::Stub::GetStepTrace, req, &resp);
  if (!status.ok()) return RpcError(status, absl::StrCat("trace ", job_id));
  std::ofstream file(out_path, std::ios::binary | std::ios::trunc);
  file << resp.trace_json();
  file.close();
  if (!file) {
    err_ << "stagectl: trace: --out: cannot write '" << out_path << "'\n";
    return 1;
  }
  const auto bytes = static_cast<int64_t>(resp.trace_json().size());
  return Print({{"job_id", job_id},
                {"global_step", resp.global_step()},
                {"first_kept_step", resp.first_kept_step()},
                {"last_kept_step", resp.last_kept_step()},
                {"out", out_path},
                {"bytes", bytes}},
               absl::StrCat(job_id, " step ", resp.global_step(), ": trace written to ", out_path,
                            " (", util::FormatBytes(bytes), "); steps ", resp.first_kept_step(),
                            "..", resp.last_kept_step(), " kept\n"));
}

int Commands::Diagnose(const std::string& job_id, int timeline) {
  v1::DiagnoseJobRequest req;
  req.set_job_id(job_id);
  v1::DiagnoseJobResponse resp;
  grpc::Status status = Call(&v1::CoordinatorService::Stub::DiagnoseJob, req, &resp);
  if (!status.ok()) return RpcError(status, absl::StrCat("diagnose ", job_id));
  return Print(ProtoJson(resp), DiagnoseText(resp, timeline));
}

}  // namespace stagecoach::client
