#include "client/schedule_command.h"

#include <fstream>
#include <initializer_list>
#include <iostream>
#include <limits>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/schedule/build.h"
#include "common/schedule/chrome_trace.h"
#include "common/schedule/csv.h"
#include "common/schedule/generators.h"
#include "common/schedule/lowering.h"
#include "common/schedule/memory_model.h"
#include "common/schedule/simulator.h"
#include "common/schedule/validator.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace stagecoach::client {
namespace {

namespace sched = ::stagecoach::schedule;

constexpr int kOk = 0;
constexpr int kInvalid = 1;
constexpr int kUsage = 2;

// A failure and the exit code it maps to.
struct Failure {
  int code;
  std::string message;
};

enum class Output { kGrid, kCsv, kJson, kChrome };

absl::StatusOr<Output> ParseOutput(const std::string& name, const char* flag) {
  if (name.empty() || name == "grid") return Output::kGrid;
  if (name == "csv") return Output::kCsv;
  if (name == "json") return Output::kJson;
  if (name == "chrome") return Output::kChrome;
  return absl::InvalidArgumentError(
      absl::StrCat(flag, ": unknown output '", name, "'; valid: grid, csv, json, chrome"));
}

// A schedule ready to print: what was generated or read, and its lowered form.
struct Prepared {
  std::string title;             // "Interleaved1F1B: 4 ranks x 2 stages, 8 microbatches"
  nlohmann::json description;    // the JSON fields that say where it came from
  sched::PipelineOrder compute;  // the compute list (or the file's rows)
  sched::PipelineOrder lowered;
  std::vector<int> stage_to_rank;
  int num_stages = 0;
  int num_microbatches = 0;
  bool has_backward = true;
};

absl::StatusOr<Prepared> Generate(const ScheduleCommandOptions& o, Failure& failure) {
  auto kind = sched::ParseScheduleKind(o.kind);
  if (!kind.ok()) {
    failure = {kUsage, absl::StrCat("--kind: ", kind.status().message())};
    return kind.status();
  }
  if (o.ranks < 1 || o.microbatches < 1) {
    failure = {kUsage, "--ranks and --microbatches are required with --kind, and must be >= 1"};
    return absl::InvalidArgumentError(failure.message);
  }
  sched::ScheduleConfig config;
  config.kind = *kind;
  config.num_ranks = o.ranks;
  config.num_microbatches = o.microbatches;
  config.stages_per_rank = o.stages_per_rank.value_or(sched::DefaultStagesPerRank(*kind));
  if (config.stages_per_rank < 1) {
    failure = {kUsage, "--stages-per-rank must be >= 1"};
    return absl::InvalidArgumentError(failure.message);
  }
  Prepared p;
  p.num_stages = sched::NumStages(config);
  p.num_microbatches = config.num_microbatches;
  p.has_backward = sched::HasBackward(*kind);
  const std::string name(sched::ScheduleKindName(*kind));
  p.title = absl::StrCat(name, ": ", config.num_ranks, " ranks x ", config.stages_per_rank,
                         config.stages_per_rank == 1 ? " stage" : " stages", ", ",
                         config.num_microbatches, " microbatches");
  p.description = {{"schedule", name},
                   {"ranks", config.num_ranks},
                   {"stages_per_rank", config.stages_per_rank},
                   {"stages", p.num_stages},
                   {"microbatches", config.num_microbatches}};

  sched::LoweringOptions lowering;
  lowering.max_active_stages =
      o.unshard.empty() ? o.max_active_stages : sched::UnshardWindow(o.unshard, p.num_stages);
  auto built = sched::BuildSchedule(config, lowering);
  if (!built.ok()) {
    failure = {kInvalid, std::string(built.status().message())};
    return built.status();
  }
  p.compute = std::move(built->compute);
  p.stage_to_rank = std::move(built->stage_to_rank);
  p.lowered = std::move(built->lowered);
  if (o.time_aligned) {
    // Shown instead of pipeline_order; the lowered list is the same either way.
    auto aligned = sched::GenerateTimeAligned(config);
    if (!aligned.ok()) {
      failure = {kInvalid, std::string(aligned.status().message())};
      return aligned.status();
    }
    p.compute = *std::move(aligned);
  }
  return p;
}

absl::StatusOr<Prepared> ReadCsv(const ScheduleCommandOptions& o, Failure& failure) {
  auto format = sched::ParseCsvFormat(o.format.empty() ? "compute_only" : o.format);
  if (!format.ok()) {
    failure = {kUsage, absl::StrCat("--format: ", format.status().message())};
    return format.status();
  }
  std::ifstream in(o.csv_path, std::ios::binary);
  if (!in) {
    failure = {kInvalid, absl::StrCat("cannot read ", o.csv_path)};
    return absl::NotFoundError(failure.message);
  }
  std::stringstream text;
  text << in.rdbuf();
  sched::CsvLoadOptions load;
  load.source = o.csv_path;
  // A window of every stage for "step": the file's stage count is not known yet.
  load.max_active_stages =
      o.unshard.empty() ? o.max_active_stages : sched::UnshardWindow(o.unshard, 1 << 20);
  load.sharded_parameters = !o.unshard.empty();
  if (o.microbatches > 0) load.num_microbatches = o.microbatches;
  auto loaded = sched::LoadScheduleCsv(text.str(), *format, load);
  if (!loaded.ok()) {
    failure = {kInvalid, std::string(loaded.status().message())};
    return loaded.status();
  }
  Prepared p;
  p.num_stages = loaded->num_stages;
  p.num_microbatches = loaded->num_microbatches;
  p.stage_to_rank = loaded->stage_to_rank;
  p.compute = std::move(loaded->order);
  p.lowered = std::move(loaded->lowered);
  const std::string format_name(sched::CsvFormatName(*format));
  p.title = absl::StrCat(o.csv_path, " (", format_name, "): ", loaded->num_ranks, " ranks, ",
                         p.num_stages, " stages, ", p.num_microbatches, " microbatches");
  p.description = {{"source", o.csv_path},
                   {"format", format_name},
                   {"ranks", loaded->num_ranks},
                   {"stages", p.num_stages},
                   {"microbatches", p.num_microbatches}};
  return p;
}

// OK when every (flag, value) is a finite number >= 0, else an error naming the first that is not.
absl::Status CheckAmounts(std::initializer_list<std::pair<const char*, double>> flags) {
  for (const auto& [flag, value] : flags) {
    if (!(value >= 0) || value == std::numeric_limits<double>::infinity()) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " must be a finite number >= 0, got ", value));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<sched::CostModel> ParseCosts(const ScheduleCommandOptions& o) {
  std::vector<std::string> parts = absl::StrSplit(o.costs, ',');
  std::vector<double> values;
  for (const std::string& part : parts) {
    double value = 0;
    if (!absl::SimpleAtod(part, &value) || !(value >= 0) ||
        value == std::numeric_limits<double>::infinity()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--costs: '", part, "' in '", o.costs, "' is not a non-negative number"));
    }
    values.push_back(value);
  }
  if (values.size() != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("--costs takes four durations F,B,I,W (e.g. 1,2,1,1), got '", o.costs, "'"));
  }
  RETURN_IF_ERROR(CheckAmounts({{"--latency", o.latency},
                                {"--bandwidth", o.bandwidth},
                                {"--message-bytes", o.message_bytes}}));
  sched::CostModel costs;
  costs.defaults.forward = values[0];
  costs.defaults.backward = values[1];
  costs.defaults.backward_input = values[2];
  costs.defaults.backward_weight = values[3];
  costs.latency = o.latency;
  costs.bandwidth = o.bandwidth;
  costs.message_bytes = o.message_bytes;
  return costs;
}

// The memory model of the --*-bytes flags, or nullopt when none is above 0.
absl::StatusOr<std::optional<sched::MemoryModel>> ParseMemory(const ScheduleCommandOptions& o) {
  RETURN_IF_ERROR(CheckAmounts({{"--activation-bytes", o.activation_bytes},
                                {"--weight-activation-bytes", o.weight_activation_bytes},
                                {"--static-bytes", o.static_bytes}}));
  if (o.weight_activation_bytes > o.activation_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--weight-activation-bytes (%.15g) is part of --activation-bytes (%.15g) and cannot "
        "exceed it",
        o.weight_activation_bytes, o.activation_bytes));
  }
  if (o.activation_bytes == 0 && o.static_bytes == 0 && o.message_bytes == 0) {
    return std::optional<sched::MemoryModel>();
  }
  sched::MemoryModel model;
  model.defaults.activations = o.activation_bytes;
  model.defaults.weight_activations = o.weight_activation_bytes;
  model.defaults.parameters = o.static_bytes;
  model.defaults.output = o.message_bytes;
  return std::optional<sched::MemoryModel>(model);
}

nlohmann::json MemoryJson(const sched::MemoryProfile& profile) {
  nlohmann::json ranks = nlohmann::json::array();
  for (size_t r = 0; r < profile.ranks.size(); ++r) {
    const sched::RankMemory& m = profile.ranks[r];
    nlohmann::json curve = nlohmann::json::array();
    for (const sched::MemoryPoint& p : m.curve) curve.push_back({p.time, p.bytes});
    ranks.push_back({{"rank", r},
                     {"static_bytes", m.static_bytes},
                     {"peak_dynamic_bytes", m.peak_dynamic},
                     {"peak_total_bytes", m.peak_total},
                     {"peak_time", m.peak_time},
                     {"peak_action", m.peak_action},
                     {"peak_microbatches", m.peak_microbatches},
                     {"curve", std::move(curve)}});
  }
  return ranks;
}

nlohmann::json ActionsJson(const sched::PipelineOrder& order) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const sched::RankActions& actions : order) {
    nlohmann::json row = nlohmann::json::array();
    for (const auto& action : actions) {
      row.push_back(action.has_value() ? nlohmann::json(action->ToString()) : nlohmann::json());
    }
    ranks.push_back(std::move(row));
  }
  return ranks;
}

nlohmann::json SimulationJson(const sched::Simulation& sim, const sched::CostModel& costs) {
  nlohmann::json ranks = nlohmann::json::array();
  for (size_t r = 0; r < sim.timeline.size(); ++r) {
    nlohmann::json timeline = nlohmann::json::array();
    for (const sched::TimedAction& t : sim.timeline[r]) {
      timeline.push_back({{"action", t.action.ToString()}, {"start", t.start}, {"end", t.end}});
    }
    ranks.push_back({{"rank", r},
                     {"busy", sim.busy[r]},
                     {"bubble_ratio", sim.bubble_ratio[r]},
                     {"timeline", std::move(timeline)}});
  }
  return {{"costs",
           {{"forward", costs.defaults.forward},
            {"backward", costs.defaults.backward},
            {"backward_input", costs.defaults.backward_input},
            {"backward_weight", costs.defaults.backward_weight},
            {"latency", costs.latency},
            {"bandwidth", costs.bandwidth},
            {"message_bytes", costs.message_bytes}}},
          {"makespan", sim.makespan},
          {"peak_activations", sim.peak_activations},
          {"messages", sim.messages.size()},
          {"ranks", std::move(ranks)}};
}

// Renders the prepared schedule; `failure` is set on error.
absl::StatusOr<std::string> Render(const ScheduleCommandOptions& o, const Prepared& p,
                                   Output output, Failure& failure) {
  const sched::PipelineOrder& shown = o.lowered ? p.lowered : p.compute;
  const bool simulate = o.simulate || output == Output::kChrome;
  if (simulate && output == Output::kCsv) {
    failure = {kUsage,
               "--simulate needs an output of grid, json or chrome; csv holds the "
               "schedule only"};
    return absl::InvalidArgumentError(failure.message);
  }
  std::optional<sched::Simulation> sim;
  std::optional<sched::MemoryProfile> memory;
  sched::CostModel costs;
  if (simulate) {
    auto parsed = ParseCosts(o);
    if (!parsed.ok()) {
      failure = {kUsage, std::string(parsed.status().message())};
      return parsed.status();
    }
    costs = *parsed;
    auto result =
        sched::Simulate(p.lowered, p.stage_to_rank, p.num_stages, p.num_microbatches, costs);
    if (!result.ok()) {
      failure = {kInvalid, absl::StrCat("simulation failed: ", result.status().message())};
      return result.status();
    }
    sim = *std::move(result);
    auto model = ParseMemory(o);
    if (!model.ok()) {
      failure = {kUsage, std::string(model.status().message())};
      return model.status();
    }
    if (model->has_value()) {
      auto profile = sched::SimulateMemory(*sim, p.stage_to_rank, p.num_stages, **model);
      if (!profile.ok()) {
        failure = {kInvalid,
                   absl::StrCat("memory simulation failed: ", profile.status().message())};
        return profile.status();
      }
      memory = *std::move(profile);
    }
  }
  switch (output) {
    case Output::kGrid: {
      std::string text =
          absl::StrCat(p.title, o.lowered ? ", lowered" : "", "\n", sched::FormatGrid(shown));
      if (sim.has_value()) absl::StrAppend(&text, "\n", sched::FormatTimeline(*sim));
      if (memory.has_value()) absl::StrAppend(&text, "\n", sched::FormatMemory(*memory));
      return text;
    }
    case Output::kCsv:
      return sched::FormatScheduleCsv(shown);
    case Output::kJson: {
      nlohmann::json doc = p.description;
      doc["stage_to_rank"] = p.stage_to_rank;
      doc["lowered"] = o.lowered;
      doc["actions"] = ActionsJson(shown);
      if (sim.has_value()) doc["simulation"] = SimulationJson(*sim, costs);
      if (memory.has_value()) doc["simulation"]["memory"] = MemoryJson(*memory);
      return doc.dump(2) + "\n";
    }
    case Output::kChrome: {
      sched::ChromeTraceOptions trace;
      trace.title = p.title;
      if (memory.has_value()) {
        for (size_t r = 0; r < memory->ranks.size(); ++r) {
          sched::TraceCounter& counter = trace.counters.emplace_back();
          counter.rank = static_cast<int>(r);
          counter.name = "memory (predicted)";
          for (const sched::MemoryPoint& point : memory->ranks[r].curve) {
            counter.points.emplace_back(point.time, point.bytes);
          }
        }
      }
      return sched::FormatChromeTrace(sim->timeline, sim->messages, trace);
    }
  }
  return std::string();
}

absl::StatusOr<Output> ChooseOutput(const ScheduleCommandOptions& o, Failure& failure) {
  const bool csv_mode = !o.csv_path.empty();
  if (!csv_mode && !o.emit.empty()) {
    failure = {kUsage, "--emit chooses the output when reading --csv; with --kind use --format"};
    return absl::InvalidArgumentError(failure.message);
  }
  auto output = csv_mode ? ParseOutput(o.emit, "--emit") : ParseOutput(o.format, "--format");
  if (!output.ok()) failure = {kUsage, std::string(output.status().message())};
  return output;
}

}  // namespace

int RunSchedule(const ScheduleCommandOptions& o, std::ostream& out, std::ostream& err) {
  auto fail = [&](const Failure& f) {
    err << "stagectl schedule: " << f.message << "\n";
    return f.code;
  };
  if (o.kind.empty() == o.csv_path.empty()) {
    return fail({kUsage,
                 "give exactly one of --kind NAME (generate a schedule) and --csv FILE "
                 "(read one)"});
  }
  if (!o.csv_path.empty() && o.time_aligned) {
    return fail({kUsage, "--time-aligned applies to generated schedules (--kind)"});
  }
  if (!o.kind.empty() && o.validate) {
    // Generated schedules are always validated; --validate is for files.
    return fail({kUsage,
                 "--validate checks a --csv file; generated schedules are always "
                 "validated"});
  }
  if (o.max_active_stages < 0) return fail({kUsage, "--max-active-stages must be >= 0"});
  if (!o.unshard.empty() && o.unshard != "step" && o.unshard != "stage") {
    return fail({kUsage, "--unshard must be step or stage, got '" + o.unshard + "'"});
  }
  Failure failure{kInvalid, ""};
  auto output = ChooseOutput(o, failure);
  if (!output.ok()) return fail(failure);
  auto prepared = o.csv_path.empty() ? Generate(o, failure) : ReadCsv(o, failure);
  if (!prepared.ok()) return fail(failure);

  std::string text;
  if (o.validate) {
    text = absl::StrCat(prepared->title, ": valid; stage to rank [",
                        absl::StrJoin(prepared->stage_to_rank, ","), "]\n");
  } else {
    auto rendered = Render(o, *prepared, *output, failure);
    if (!rendered.ok()) return fail(failure);
    text = *std::move(rendered);
  }
  if (o.out_path.empty()) {
    out << text;
    return kOk;
  }
  std::ofstream file(o.out_path, std::ios::binary | std::ios::trunc);
  file << text;
  file.close();
  if (!file) return fail({kInvalid, absl::StrCat("cannot write ", o.out_path)});
  return kOk;
}

}  // namespace stagecoach::client
