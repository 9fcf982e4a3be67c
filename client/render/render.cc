#include "client/render/render.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/render/render_balance.h"
#include "client/render/render_diagnosis.h"
#include "client/render/render_memory.h"
#include "client/render/render_plan.h"
#include "client/render/render_recovery.h"
#include "common/rpc/tensor_data.h"
#include "common/rpc/time_conversion.h"

namespace stagecoach::client {
namespace {

std::string StripPrefix(const std::string& name, absl::string_view prefix) {
  if (name.compare(0, prefix.size(), prefix.data(), prefix.size()) == 0) {
    return name.substr(prefix.size());
  }
  return name;
}

std::string Age(const google::protobuf::Timestamp& t) {
  const absl::Duration age = absl::Now() - rpc::FromProtoTimestamp(t);
  const int64_t s = absl::ToInt64Seconds(age);
  if (s < 120) return absl::StrCat(std::max<int64_t>(s, 0), "s");
  if (s < 7200) return absl::StrCat(s / 60, "m");
  return absl::StrCat(s / 3600, "h");
}

void EmitYaml(YAML::Emitter& out, const nlohmann::json& v) {
  if (v.is_object()) {
    out << YAML::BeginMap;
    for (const auto& [key, value] : v.items()) {
      out << YAML::Key << key << YAML::Value;
      EmitYaml(out, value);
    }
    out << YAML::EndMap;
  } else if (v.is_array()) {
    out << YAML::BeginSeq;
    for (const auto& value : v) EmitYaml(out, value);
    out << YAML::EndSeq;
  } else if (v.is_string()) {
    out << v.get<std::string>();
  } else if (v.is_boolean()) {
    out << v.get<bool>();
  } else if (v.is_number_integer()) {
    out << v.get<int64_t>();
  } else if (v.is_number()) {
    out << v.get<double>();
  } else {
    out << YAML::Null;
  }
}

// TensorData bytes are little-endian and decoded by copying.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "TensorData needs a little-endian host");

// Element `i` of a valid tensor as JSON (a number).
nlohmann::json Element(const v1::TensorData& t, int64_t i) {
  const char* p = t.data().data();
  if (t.dtype() == "float32") {
    float v;
    std::memcpy(&v, p + 4 * i, 4);
    return v;
  }
  if (t.dtype() == "float64") {
    double v;
    std::memcpy(&v, p + 8 * i, 8);
    return v;
  }
  if (t.dtype() == "int64") {
    int64_t v;
    std::memcpy(&v, p + 8 * i, 8);
    return v;
  }
  int32_t v;
  std::memcpy(&v, p + 4 * i, 4);
  return v;
}

// Dimensions [dim, rank) of a valid tensor from element `offset` on, as nested arrays.
nlohmann::json Nested(const v1::TensorData& t, int dim, int64_t offset) {
  if (dim == t.shape_size()) return Element(t, offset);
  int64_t stride = 1;
  for (int d = dim + 1; d < t.shape_size(); ++d) stride *= t.shape(d);
  nlohmann::json out = nlohmann::json::array();
  for (int64_t i = 0; i < t.shape(dim); ++i) out.push_back(Nested(t, dim + 1, offset + i * stride));
  return out;
}

}  // namespace

std::string TimestampString(const google::protobuf::Timestamp& t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", rpc::FromProtoTimestamp(t), absl::UTCTimeZone());
}

absl::StatusOr<OutputFormat> ParseOutputFormat(const std::string& text) {
  if (text == "table") return OutputFormat::kTable;
  if (text == "json") return OutputFormat::kJson;
  if (text == "yaml") return OutputFormat::kYaml;
  return absl::InvalidArgumentError(
      absl::StrCat("-o: must be table, json or yaml, got '", text, "'"));
}

std::string StateName(v1::JobState state) {
  return StripPrefix(v1::JobState_Name(state), "JOB_STATE_");
}

bool IsFinalState(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

std::string StateName(v1::WorkerState state) {
  return StripPrefix(v1::WorkerState_Name(state), "WORKER_STATE_");
}

// Bytes by peer rank, as a JSON object keyed by the rank ("1": 4096).
nlohmann::json PeerBytesJson(const google::protobuf::Map<int32_t, int64_t>& bytes) {
  std::map<int32_t, int64_t> sorted(bytes.begin(), bytes.end());
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [peer, n] : sorted) out[std::to_string(peer)] = n;
  return out;
}

namespace {

// Every rank of a job, for its JSON.
nlohmann::json RanksJson(const v1::Job& job) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : job.ranks()) {
    ranks.push_back({
        {"rank", r.rank()},
        {"replica", r.replica()},
        {"worker_id", r.worker_id()},
        {"reduction_bytes_sent", r.reduction_bytes_sent()},
        {"reduction_hidden_ratio", r.reduction_hidden_ratio()},
        {"gather_hidden_ratio", r.gather_hidden_ratio()},
        {"held_parameter_bytes", r.held_parameter_bytes()},
        {"held_gradient_bytes", r.held_gradient_bytes()},
        {"peak_live_bytes", r.peak_live_bytes()},
        {"stages", std::vector<int>(r.stages().begin(), r.stages().end())},
        {"steps_done", r.steps_done()},
        {"bytes_sent", r.bytes_sent()},
        {"bytes_received", r.bytes_received()},
        {"bytes_sent_to", PeerBytesJson(r.bytes_sent_to())},
        {"bytes_received_from", PeerBytesJson(r.bytes_received_from())},
        {"parameters", r.parameters()},
        {"assigned_actions",
         std::vector<std::string>(r.assigned_actions().begin(), r.assigned_actions().end())},
        {"executed_actions",
         std::vector<std::string>(r.executed_actions().begin(), r.executed_actions().end())},
    });
  }
  return ranks;
}

// The training recipe's fields of a job's JSON.
void AddTrainingJson(const v1::Job& job, nlohmann::json& out) {
  out["learning_rate"] = job.learning_rate();
  out["grad_norm"] = job.has_grad_norm() ? nlohmann::json(job.grad_norm()) : nlohmann::json();
  out["skipped_steps"] =
      std::vector<int64_t>(job.skipped_steps().begin(), job.skipped_steps().end());
  out["consecutive_skipped_steps"] = job.consecutive_skipped_steps();
  nlohmann::json evals = nlohmann::json::array();
  for (const auto& e : job.evals()) {
    evals.push_back({{"global_step", e.global_step()}, {"loss", e.loss()}});
  }
  out["evals"] = evals;
}

}  // namespace

nlohmann::json JobJson(const v1::Job& job) {
  nlohmann::json out;
  out["id"] = job.id();
  out["name"] = job.name();
  out["state"] = StateName(job.state());
  out["reason"] = job.reason();
  out["steps_done"] = job.steps_done();
  out["steps_total"] = job.steps_total();
  // A skipped step's loss (NaN) is null.
  nlohmann::json losses = nlohmann::json::array();
  for (double loss : job.losses()) {
    losses.push_back(std::isnan(loss) ? nlohmann::json() : nlohmann::json(loss));
  }
  out["losses"] = losses;
  // losses[i] is job step history_first_step + i (GetJob returns a window of the history).
  out["history_first_step"] = job.history_first_step();
  out["missing_loss_steps"] =
      std::vector<int64_t>(job.missing_loss_steps().begin(), job.missing_loss_steps().end());
  if (job.has_stall()) out["stall"] = ProtoJson(job.stall());
  if (job.stragglers_size() > 0 || job.pace_size() > 0) {
    out["stragglers"] = nlohmann::json::array();
    for (const v1::RankStraggler& s : job.stragglers()) out["stragglers"].push_back(ProtoJson(s));
    out["pace"] = nlohmann::json::array();
    for (const v1::RankPace& p : job.pace()) out["pace"].push_back(ProtoJson(p));
  }
  if (job.has_data_records()) {
    out["data_records"] = {{"read", job.data_records().read()},
                           {"truncated", job.data_records().truncated()},
                           {"skipped", job.data_records().skipped()}};
  }
  out["max_bubble_ratios"] =
      std::vector<double>(job.max_bubble_ratios().begin(), job.max_bubble_ratios().end());
  AddTrainingJson(job, out);
  out["schedule"] = job.schedule();
  out["num_stages"] = job.num_stages();
  out["num_ranks"] = job.num_ranks();
  out["replicas"] = std::max(1, job.replicas());
  out["healthy_replicas"] =
      job.lost_replicas_size() > 0 ? job.healthy_replicas() : std::max(1, job.replicas());
  out["lost_replicas"] = std::vector<int>(job.lost_replicas().begin(), job.lost_replicas().end());
  out["healing_replica"] = job.lost_replicas_size() > 0 ? job.healing_replica() : -1;
  out["microbatches"] = job.microbatches();
  out["created_time"] = TimestampString(job.created_time());
  nlohmann::json history = nlohmann::json::array();
  for (const auto& t : job.history()) {
    history.push_back({{"state", StateName(t.state())},
                       {"reason", t.reason()},
                       {"time", TimestampString(t.time())}});
  }
  out["history"] = history;
  out["history_transitions_omitted"] = job.history_transitions_omitted();
  out["ranks"] = RanksJson(job);
  out["memory"] = MemoryJson(job);
  out["balance"] = BalanceJson(job);
  if (job.has_plan_choice()) out["plan_choice"] = PlanChoiceJson(job);
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& l : job.layers()) {
    layers.push_back({{"name", l.name()},
                      {"parameters", l.parameters()},
                      {"forward_seconds", l.forward_seconds()},
                      {"backward_seconds", l.backward_seconds()}});
  }
  out["layers"] = layers;
  nlohmann::json stages = nlohmann::json::array();
  for (const auto& st : job.stages()) {
    stages.push_back({{"stage", st.stage()},
                      {"first_layer", st.first_layer()},
                      {"end_layer", st.end_layer()},
                      {"parameters", st.parameters()}});
  }
  out["stages"] = stages;
  nlohmann::json checkpoints = nlohmann::json::array();
  for (const auto& c : job.checkpoints()) {
    checkpoints.push_back(
        {{"step", c.step()}, {"directory", c.directory()}, {"manifest", c.manifest()}});
  }
  out["checkpoints"] = checkpoints;
  if (job.has_resumed_from()) {
    out["resumed_from"] = {{"step", job.resumed_from().step()},
                           {"directory", job.resumed_from().directory()}};
  }
  out["global_steps_done"] = job.global_steps_done();
  out["pause_at_global_step"] = job.pause_at_global_step();
  out["attempt"] = job.attempt();
  out["restarts"] = job.restarts();
  out["max_restarts"] = job.max_restarts();
  if (job.has_failure()) out["failure"] = FailureJson(job.failure());
  return out;
}

nlohmann::json FailureJson(const v1::JobFailure& failure) {
  return {{"rank", failure.rank()},
          {"worker_id", failure.worker_id()},
          {"action", failure.action()},
          {"error", failure.error()},
          {"time", TimestampString(failure.time())}};
}

std::string FailureText(const v1::JobFailure& failure) {
  std::string out = failure.rank() >= 0 ? absl::StrCat("rank ", failure.rank()) : "no rank";
  if (!failure.worker_id().empty()) absl::StrAppend(&out, " on ", failure.worker_id());
  if (!failure.action().empty()) absl::StrAppend(&out, " at ", failure.action());
  if (!failure.error().empty()) absl::StrAppend(&out, ": ", failure.error());
  return out;
}

nlohmann::json JobScheduleJson(const std::string& job_id, const v1::GetJobScheduleResponse& s) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : s.ranks()) {
    ranks.push_back({{"rank", r.rank()},
                     {"stages", std::vector<int>(r.stages().begin(), r.stages().end())},
                     {"compute_actions", std::vector<std::string>(r.compute_actions().begin(),
                                                                  r.compute_actions().end())},
                     {"lowered_actions", std::vector<std::string>(r.lowered_actions().begin(),
                                                                  r.lowered_actions().end())}});
  }
  nlohmann::json out;
  out["job_id"] = job_id;
  out["schedule"] = s.schedule();
  out["num_stages"] = s.num_stages();
  out["num_ranks"] = s.num_ranks();
  out["microbatches"] = s.microbatches();
  out["ranks"] = ranks;
  out["grid"] = s.grid();
  out["lowered_grid"] = s.lowered_grid();
  return out;
}

std::string Render(OutputFormat format, const nlohmann::json& value, const std::string& table) {
  switch (format) {
    case OutputFormat::kTable:
      return table;
    case OutputFormat::kJson:
      return value.dump(2) + "\n";
    case OutputFormat::kYaml:
      return ToYaml(value);
  }
  return table;
}

nlohmann::json WorkerJson(const v1::WorkerInfo& w) {
  return {
      {"id", w.id()},
      {"name", w.name()},
      {"address", w.address()},
      {"state", StateName(w.state())},
      {"job_id", w.job_id()},
      {"rank", w.rank()},
      {"device", w.device()},
      {"transports", std::vector<std::string>(w.transports().begin(), w.transports().end())},
      {"last_heartbeat_time", TimestampString(w.last_heartbeat_time())},
      {"reason", w.reason()},
      {"reserved_for_job", w.reserved_for_job()},
  };
}

std::string ToYaml(const nlohmann::json& value) {
  YAML::Emitter out;
  EmitYaml(out, value);
  return std::string(out.c_str()) + "\n";
}

std::string TensorSummary(const std::string& job_id, const v1::TensorData& tensor) {
  constexpr int64_t kShown = 8;
  const int64_t size = rpc::DTypeSize(tensor.dtype());
  const int64_t count = size > 0 ? static_cast<int64_t>(tensor.data().size()) / size : 0;
  std::vector<std::string> values;
  for (int64_t i = 0; i < std::min(count, kShown); ++i) {
    const nlohmann::json v = Element(tensor, i);
    values.push_back(v.is_number_float() ? absl::StrFormat("%.6g", v.get<double>()) : v.dump());
  }
  std::string out = absl::StrCat(job_id, " outputs: ", rpc::DescribeTensorData(tensor), "\n");
  absl::StrAppend(&out, "first values: ", absl::StrJoin(values, ", "),
                  count > kShown ? ", ..." : "", "\n");
  return out;
}

nlohmann::json TensorJson(const std::string& job_id, const v1::TensorData& tensor) {
  nlohmann::json out;
  out["job_id"] = job_id;
  out["dtype"] = tensor.dtype();
  out["shape"] = std::vector<int64_t>(tensor.shape().begin(), tensor.shape().end());
  out["values"] = Nested(tensor, 0, 0);
  return out;
}

std::string FormatTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    widths.resize(std::max(widths.size(), row.size()), 0);
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(widths[i] - row[i].size() + 2, ' ');
    }
    out += line + "\n";
  }
  return out;
}

std::string JobsTable(const std::vector<v1::Job>& jobs) {
  std::vector<std::vector<std::string>> rows = {{"ID", "NAME", "STATE", "STEPS", "GLOBAL", "LOSS",
                                                 "SCHEDULE", "STAGES", "RESTARTS", "AGE",
                                                 "REASON"}};
  for (const auto& j : jobs) {
    std::string state = StateName(j.state());
    if (j.pause_at_global_step() > 0 && !IsFinalState(j.state())) {
      absl::StrAppend(&state, "@", j.pause_at_global_step());
    }
    rows.push_back({j.id(), j.name(), state, absl::StrCat(j.steps_done(), "/", j.steps_total()),
                    absl::StrCat(j.global_steps_done()),
                    j.losses().empty() ? "-" : absl::StrFormat("%.4f", *j.losses().rbegin()),
                    j.schedule(), absl::StrCat(j.num_stages()),
                    absl::StrCat(j.restarts(), "/", j.max_restarts()), Age(j.created_time()),
                    j.reason()});
  }
  return FormatTable(rows);
}

std::string WorkersTable(const std::vector<v1::WorkerInfo>& workers) {
  std::vector<std::vector<std::string>> rows = {
      {"ID", "NAME", "ADDRESS", "DEVICE", "STATE", "JOB", "RANK", "HEARTBEAT"}};
  for (const auto& w : workers) {
    std::string state = StateName(w.state());
    if (w.state() == v1::WORKER_STATE_LOST && !w.reason().empty()) {
      absl::StrAppend(&state, " (", w.reason(), ")");
    }
    if (!w.reserved_for_job().empty())
      absl::StrAppend(&state, " (spare of ", w.reserved_for_job(), ")");
    rows.push_back({w.id(), w.name(), w.address(), w.device(), state,
                    w.job_id().empty() ? "-" : w.job_id(),
                    w.rank() < 0 ? "-" : absl::StrCat(w.rank()),
                    absl::StrCat(Age(w.last_heartbeat_time()), " ago")});
  }
  return FormatTable(rows);
}

namespace {

// The workers of a replicated job as a replica x stage grid (each stage's column names the
// worker holding it in that replica).
std::string ReplicaGrid(const v1::Job& j) {
  std::vector<std::vector<std::string>> rows = {{"REPLICA"}};
  for (int s = 0; s < j.num_stages(); ++s) rows[0].push_back(absl::StrCat("STAGE ", s));
  for (int replica = 0; replica < j.replicas(); ++replica) {
    std::vector<std::string> row(j.num_stages() + 1);
    row[0] = absl::StrCat(replica);
    for (const auto& r : j.ranks()) {
      if (r.replica() != replica) continue;
      for (int s : r.stages()) {
        if (s >= 0 && s < j.num_stages()) row[s + 1] = r.worker_id();
      }
    }
    rows.push_back(std::move(row));
  }
  return FormatTable(rows);
}

// A step's loss; a skipped step has none (NaN).
std::string LossText(double loss) {
  return std::isnan(loss) ? "skipped" : absl::StrFormat("%.6f", loss);
}

// The training recipe's lines of `stagectl status`: learning rate and gradient norm of the
// latest step, skipped steps, validation losses.
std::string TrainingLines(const v1::Job& j) {
  std::ostringstream out;
  if (j.learning_rate() > 0) {
    out << "LR:        " << absl::StrFormat("%.6g", j.learning_rate()) << " (latest step)";
    if (j.has_grad_norm()) out << "; grad norm " << absl::StrFormat("%.6g", j.grad_norm());
    out << "\n";
  }
  if (j.skipped_steps_size() > 0) {
    std::vector<int64_t> latest(j.skipped_steps().begin(), j.skipped_steps().end());
    constexpr size_t kShown = 8;
    if (latest.size() > kShown) latest.erase(latest.begin(), latest.end() - kShown);
    out << "Skipped:   " << j.skipped_steps_size() << " steps (non-finite gradients), global steps "
        << (j.skipped_steps_size() > static_cast<int>(kShown) ? "... " : "")
        << absl::StrJoin(latest, ", ") << "; " << j.consecutive_skipped_steps()
        << " in a row now\n";
  }
  if (j.evals_size() > 0) {
    const v1::EvalResult& latest = *j.evals().rbegin();
    out << "Eval loss: " << absl::StrFormat("%.6f", latest.loss()) << " after global step "
        << latest.global_step() + 1 << " (" << j.evals_size() << " passes";
    if (j.evals_size() > 1) {
      out << ", first " << absl::StrFormat("%.6f", j.evals(0).loss());
    }
    out << ")\n";
  }
  return out.str();
}

// The STAGE / LAYERS / PARAMS table of `stagectl status`.
std::string StageTable(const v1::Job& j) {
  std::vector<std::vector<std::string>> rows = {{"STAGE", "LAYERS", "PARAMS"}};
  for (const auto& st : j.stages()) {
    std::string layers;
    if (st.first_layer() >= 0 && st.end_layer() <= j.layers_size() &&
        st.first_layer() < st.end_layer()) {
      layers = j.layers(st.first_layer()).name();
      if (st.end_layer() - st.first_layer() > 1) {
        layers = absl::StrCat(layers, " .. ", j.layers(st.end_layer() - 1).name());
      }
    }
    rows.push_back({absl::StrCat(st.stage()), layers, absl::StrCat(st.parameters())});
  }
  return FormatTable(rows);
}

}  // namespace

std::string JobDetails(const v1::Job& j) {
  std::ostringstream out;
  out << "Job:       " << j.id() << " (" << j.name() << ")\n";
  out << "State:     " << StateName(j.state()) << "\n";
  if (!j.reason().empty()) out << "Reason:    " << j.reason() << "\n";
  out << "Schedule:  " << j.schedule() << ", " << j.num_stages() << " stages on " << j.num_ranks()
      << " workers, " << j.microbatches() << " microbatches";
  if (j.replicas() > 1) {
    out << "; " << j.replicas() << " replicas (" << j.num_ranks() * j.replicas() << " workers, "
        << j.microbatches() * j.replicas() << " microbatches a step)";
  }
  out << "\n";
  out << RecoveryLines(j);
  out << DiagnosisLines(j);
  out << "Steps:     " << j.steps_done() << "/" << j.steps_total() << " (global step "
      << j.global_steps_done() << ")\n";
  if (j.pause_at_global_step() > 0 && !IsFinalState(j.state())) {
    out << "Pause:     " << (j.state() == v1::JOB_STATE_PAUSED ? "holding" : "will hold")
        << " at global step " << j.pause_at_global_step() << "\n";
  }
  if (j.attempt() > 0 || j.max_restarts() > 0) {
    out << "Attempt:   " << j.attempt() << " (restarts " << j.restarts() << "/" << j.max_restarts()
        << ")\n";
  }
  if (j.has_failure()) {
    out << "Failure:   " << FailureText(j.failure()) << " (" << TimestampString(j.failure().time())
        << ")\n";
  }
  if (!j.losses().empty()) {
    const int64_t first = j.history_first_step();
    out << "Loss:      " << LossText(*j.losses().begin()) << " (step " << first << ") -> "
        << LossText(*j.losses().rbegin()) << " (step " << first + j.losses_size() - 1
        << ", latest shown)\n";
  }
  if (j.missing_loss_steps_size() > 0) {
    out << "Missing:   no loss recorded for step(s) " << absl::StrJoin(j.missing_loss_steps(), ", ")
        << "\n";
  }
  if (j.has_data_records()) {
    out << "Records:   " << j.data_records().read() << " read, " << j.data_records().truncated()
        << " truncated, " << j.data_records().skipped()
        << " skipped (longer than the window: data.overlong)\n";
  }
  out << TrainingLines(j);
  out << PlanChoiceText(j);
  out << BalanceLines(j);
  if (j.has_resumed_from()) {
    out << "Resumed:   from " << j.resumed_from().directory() << " (step "
        << j.resumed_from().step() << ")\n";
  }
  if (j.checkpoints_size() > 0) {
    const v1::JobCheckpoint& latest = *j.checkpoints().rbegin();
    out << "Checkpoint: step " << latest.step() << " in " << latest.directory() << " ("
        << j.checkpoints_size() << " complete)\n";
  }
  if (j.stages_size() > 0 && j.layers_size() > 0) out << "\n" << StageTable(j);
  if (j.balance_size() > 0) out << "\n" << BalanceTable(j);
  if (j.ranks_size() > 0 && j.replicas() > 1) out << "\n" << ReplicaGrid(j);
  if (j.memory_size() > 0) out << "\n" << MemoryTable(j);
  if (j.ranks_size() > 0) {
    const bool replicated = j.replicas() > 1;
    std::vector<std::vector<std::string>> rows = {
        {"RANK", "WORKER", "STAGES", "PARAMS", "STEPS", "SENT", "RECEIVED"}};
    if (replicated) {
      rows[0].insert(rows[0].begin(), "REPLICA");
      rows[0].insert(rows[0].end(), {"REDUCED", "HIDDEN"});
    }
    for (const auto& r : j.ranks()) {
      std::vector<std::string> row = {absl::StrCat(r.rank()),
                                      r.worker_id(),
                                      absl::StrJoin(r.stages(), ","),
                                      absl::StrCat(r.parameters()),
                                      absl::StrCat(r.steps_done()),
                                      absl::StrCat(r.bytes_sent(), " B"),
                                      absl::StrCat(r.bytes_received(), " B")};
      if (replicated) {
        row.insert(row.begin(), absl::StrCat(r.replica()));
        row.push_back(absl::StrCat(r.reduction_bytes_sent(), " B"));
        row.push_back(absl::StrFormat("%.2f", r.reduction_hidden_ratio()));
      }
      rows.push_back(std::move(row));
    }
    out << "\n" << FormatTable(rows);
  }
  out << "\nHistory:\n";
  if (j.history_transitions_omitted() > 0) {
    out << "  (" << j.history_transitions_omitted()
        << " earlier state changes not shown: stagectl status --history)\n";
  }
  for (const auto& t : j.history()) {
    out << "  " << TimestampString(t.time()) << "  " << StateName(t.state());
    if (!t.reason().empty()) out << "  " << t.reason();
    out << "\n";
  }
  return out.str();
}

}  // namespace stagecoach::client
