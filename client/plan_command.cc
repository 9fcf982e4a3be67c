// `stagectl plan` (commands.h): the coordinator's plan search for a spec, ranked; and
// `stagectl inspect`: the layers and split points a model offers.
#include "absl/strings/str_cat.h"
#include "client/commands.h"
#include "client/render/render_balance.h"
#include "client/render/render_model.h"
#include "client/render/render_plan.h"
#include "common/util/byte_size.h"

namespace stagecoach::client {

int Commands::Plan(const std::string& spec_path, const std::string& memory_limit, int top,
                   const SubmitUploads& uploads) {
  int64_t limit = 0;
  if (!memory_limit.empty()) {
    absl::StatusOr<int64_t> bytes = util::ParseBytes(memory_limit);
    if (!bytes.ok() || *bytes <= 0) {
      err_ << "stagectl: plan: --memory-limit: "
           << (bytes.ok() ? "must be more than 0 bytes" : bytes.status().message()) << "\n";
      return 2;
    }
    limit = *bytes;
  }
  if (top < 1) {
    err_ << "stagectl: plan: --top: must be at least 1, got " << top << "\n";
    return 2;
  }
  std::string spec_yaml;
  if (int rc = ReadSpec("plan", spec_path, uploads, &spec_yaml); rc != 0) return rc;
  v1::PlanSpecRequest req;
  req.set_spec_yaml(spec_yaml);
  req.set_spec_origin(spec_path);
  req.set_memory_limit_bytes(limit);
  v1::PlanSpecResponse resp;
  // The coordinator profiles the model on a worker (twice: at the largest and the smallest
  // microbatch) before it searches.
  grpc::Status status = Call(&v1::CoordinatorService::Stub::PlanSpec, req, &resp,
                             options_.timeout + 2 * kSubmitInspectionAllowance);
  if (!status.ok()) {
    if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
      err_ << "stagectl: plan: the coordinator refused " << spec_path << ":\n"
           << status.error_message() << "\n";
      return 1;
    }
    return RpcError(status, "plan");
  }
  Print(PlanJson(resp), PlanTable(resp, top));
  int fitting = 0;
  for (const v1::PlanCandidate& c : resp.candidates()) fitting += c.fits() ? 1 : 0;
  if (fitting == 0) {
    err_ << "stagectl: plan: no plan fits " << util::FormatBytes(resp.memory_limit_bytes())
         << " per worker\n";
    return 1;
  }
  return 0;
}

int Commands::Inspect(const std::string& model, bool upload, const std::string& device) {
  std::string ref = model;
  if (upload) {
    if (int rc = UploadFile("inspect", model, "MODEL", &ref); rc != 0) return rc;
  }
  v1::DescribeModelRequest req;
  req.set_torchscript(ref);
  req.set_device(device);
  v1::DescribeModelResponse resp;
  grpc::Status status = Call(&v1::CoordinatorService::Stub::DescribeModel, req, &resp,
                             options_.timeout + kSubmitInspectionAllowance);
  if (!status.ok()) return RpcError(status, "inspect");
  return Print(ModelJson(model, resp), ModelTable(model, resp));
}

int Commands::PlanOfJob(const std::string& job_id) {
  v1::GetJobRequest req;
  req.set_job_id(job_id);
  v1::GetJobResponse resp;
  grpc::Status status = Call(&v1::CoordinatorService::Stub::GetJob, req, &resp);
  if (!status.ok()) return RpcError(status, absl::StrCat("plan --job ", job_id));
  const v1::Job& job = resp.job();
  std::string text =
      absl::StrCat("Job:       ", job.id(), " (", job.name(), ")\n", "Schedule:  ", job.schedule(),
                   ", ", job.num_stages(), " stages on ", job.num_ranks(), " workers, ",
                   job.microbatches(), " microbatches\n", BalanceLines(job));
  const std::string table = BalanceTable(job);
  if (!table.empty()) absl::StrAppend(&text, "\n", table);
  nlohmann::json json = BalanceJson(job);
  json["job_id"] = job.id();
  json["schedule"] = job.schedule();
  return Print(json, text);
}

}  // namespace stagecoach::client
