// The deployment files besides the Helm chart, held to the code they deploy:
// - deploy/grafana/stagecoach-dashboard.json: every metric a panel queries is one the real
//   coordinator and worker serve (scraped from their /metrics while they run a job), with the
//   labels the queries group and filter by; the template variables Grafana needs are there.
// - deploy/docker/*.Dockerfile: every COPY source exists in the repository (the build context)
//   and is not left out by .dockerignore, every `--target` is a CMake target whose folder is
//   copied and whose binary the runtime stage takes from where CMake puts it, the builder's
//   Debian packages are scripts/lib.sh's, and the runtime stage runs as a numeric non-root user.
// No container engine runs here: the images themselves are not built by this test.
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/local_cluster.h"
#include "tests/support/prometheus_scrape.h"
#include "tests/support/test_paths.h"
#include "tests/support/token_files.h"

namespace stagecoach::testing::deploy_files_test {
namespace {

namespace fs = std::filesystem;

std::string RepoRoot() { return STAGECOACH_SOURCE_DIR; }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// ---------------------------------------------------------------------------------------------
// The dashboard.

const char kDashboard[] = "deploy/grafana/stagecoach-dashboard.json";

nlohmann::json LoadDashboard() {
  const std::string text = ReadFile(RepoRoot() + "/" + kDashboard);
  EXPECT_FALSE(text.empty()) << kDashboard << " is missing or empty";
  return nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
}

// Every panel's PromQL expressions with the panel's title, rows' nested panels included.
std::vector<std::pair<std::string, std::string>> Queries(const nlohmann::json& dashboard) {
  std::vector<std::pair<std::string, std::string>> out;
  std::vector<const nlohmann::json*> panels;
  if (!dashboard.contains("panels") || !dashboard["panels"].is_array()) return out;
  for (const auto& p : dashboard["panels"]) {
    panels.push_back(&p);
    if (p.contains("panels") && p["panels"].is_array()) {
      for (const auto& nested : p["panels"]) panels.push_back(&nested);
    }
  }
  for (const nlohmann::json* p : panels) {
    for (const auto& t : p->value("targets", nlohmann::json::array())) {
      if (t.contains("expr")) out.emplace_back(p->value("title", ""), t["expr"].get<std::string>());
    }
  }
  // Query variables' definitions (label_values(metric, label)) too.
  const nlohmann::json variables = dashboard.contains("templating")
                                       ? dashboard["templating"].value("list", nlohmann::json())
                                       : nlohmann::json();
  for (const auto& v : variables) {
    if (v.is_object() && v.value("type", "") == "query" && v.contains("definition")) {
      out.emplace_back("variable " + v.value("name", ""), v["definition"].get<std::string>());
    }
  }
  return out;
}

// Metric names in a PromQL expression: identifiers starting with stagecoach_ (every Stagecoach
// metric carries the prefix; PromQL functions and label names never do).
std::set<std::string> MetricNames(const std::string& expr) {
  static const std::regex kName("stagecoach_[a-zA-Z0-9_]*");
  std::set<std::string> names;
  for (auto it = std::sregex_iterator(expr.begin(), expr.end(), kName);
       it != std::sregex_iterator(); ++it) {
    names.insert(it->str());
  }
  return names;
}

// Label names an expression groups by (`by (a, b)`), matches on (`{a="x", b!="y"}`) or lists
// (`label_values(metric, a)`).
std::set<std::string> LabelNames(const std::string& expr) {
  std::set<std::string> labels;
  static const std::regex kBy("\\bby\\s*\\(([^)]*)\\)");
  for (auto it = std::sregex_iterator(expr.begin(), expr.end(), kBy); it != std::sregex_iterator();
       ++it) {
    for (absl::string_view l : absl::StrSplit((*it)[1].str(), ',', absl::SkipWhitespace())) {
      labels.insert(std::string(absl::StripAsciiWhitespace(l)));
    }
  }
  static const std::regex kLabelValues("label_values\\s*\\([^,]*,\\s*([a-zA-Z_][a-zA-Z0-9_]*)");
  for (auto it = std::sregex_iterator(expr.begin(), expr.end(), kLabelValues);
       it != std::sregex_iterator(); ++it) {
    labels.insert((*it)[1].str());
  }
  static const std::regex kMatcher("[{,]\\s*([a-zA-Z_][a-zA-Z0-9_]*)\\s*(=~|!~|!=|=)");
  for (auto it = std::sregex_iterator(expr.begin(), expr.end(), kMatcher);
       it != std::sregex_iterator(); ++it) {
    labels.insert((*it)[1].str());
  }
  return labels;
}

// Sample names and, per sample name, the label names its series carry, from scraped series
// keys (`name` or `name{a="x",b="y"}`).
struct Exported {
  std::map<std::string, std::set<std::string>> labels_by_name;

  void Add(const std::map<std::string, double>& samples) {
    static const std::regex kLabel("([a-zA-Z_][a-zA-Z0-9_]*)=\"");
    for (const auto& [series, value] : samples) {
      const size_t brace = series.find('{');
      const std::string name = series.substr(0, brace);
      auto& labels = labels_by_name[name];
      if (brace == std::string::npos) continue;
      const std::string rest = series.substr(brace);
      for (auto it = std::sregex_iterator(rest.begin(), rest.end(), kLabel);
           it != std::sregex_iterator(); ++it) {
        labels.insert((*it)[1].str());
      }
    }
  }
};

TEST(Dashboard, IsAGrafanaDashboardWithDatasourceAndJobVariables) {
  const nlohmann::json d = LoadDashboard();
  ASSERT_TRUE(d.is_object()) << kDashboard << " is not valid JSON";
  EXPECT_GE(d.value("schemaVersion", 0), 36) << "schemaVersion";
  EXPECT_FALSE(d.value("title", "").empty()) << "title";
  std::map<std::string, nlohmann::json> vars;
  ASSERT_TRUE(d.contains("templating") && d["templating"].contains("list")) << "templating.list";
  for (const auto& v : d["templating"]["list"]) vars[v.value("name", "")] = v;
  ASSERT_TRUE(vars.count("datasource")) << "templating: no `datasource` variable";
  EXPECT_EQ(vars["datasource"].value("type", ""), "datasource");
  EXPECT_EQ(vars["datasource"].value("query", ""), "prometheus");
  ASSERT_TRUE(vars.count("job")) << "templating: no `job` variable";
  EXPECT_EQ(vars["job"].value("type", ""), "query");
  EXPECT_TRUE(absl::StrContains(vars["job"].value("definition", ""), "label_values("))
      << vars["job"].dump();

  // Every query panel reads the chosen data source, and every query names a metric.
  std::set<int> ids;
  ASSERT_TRUE(d.contains("panels") && d["panels"].is_array()) << "panels";
  for (const auto& p : d["panels"]) {
    EXPECT_TRUE(ids.insert(p.value("id", -1)).second) << "duplicate panel id " << p.value("id", -1);
    if (p.value("type", "") == "row") continue;
    EXPECT_EQ(p.value("datasource", nlohmann::json::object()).value("uid", ""), "${datasource}")
        << p.value("title", "");
    ASSERT_FALSE(p.value("targets", nlohmann::json::array()).empty()) << p.value("title", "");
  }
  for (const auto& [title, expr] : Queries(d)) {
    EXPECT_FALSE(MetricNames(expr).empty()) << title << ": " << expr;
  }
}

TEST(Dashboard, EveryQueriedMetricAndLabelIsExportedByARunningCluster) {
  const nlohmann::json d = LoadDashboard();
  ASSERT_TRUE(d.is_object()) << kDashboard << " is not valid JSON";
  const auto queries = Queries(d);
  ASSERT_FALSE(queries.empty()) << "the dashboard has no queries";

  ClusterOptions options;
  options.workers = 4;  // 2 ranks x 2 replicas: the data-parallel series exist too
  options.coordinator_args = {"--metrics-listen", "127.0.0.1:0"};
  options.worker_args = {"--metrics-listen", "127.0.0.1:0"};
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  std::vector<std::string> endpoints;
  auto coordinator_metrics = ReadMetricsAddress(c.coordinator());
  ASSERT_TRUE(coordinator_metrics.ok()) << coordinator_metrics.status();
  endpoints.push_back(*coordinator_metrics);
  for (int i = 0; i < c.num_workers(); ++i) {
    auto address = ReadMetricsAddress(c.worker(i));
    ASSERT_TRUE(address.ok()) << address.status();
    endpoints.push_back(*address);
  }

  // A tiny training job on token data (documents packed into rows) with 2 data-parallel
  // replicas sharding their parameters, clipping and an eval pass, so that per-job series (the
  // gradient reduction's and all-gathers', the training recipe's and the token data's among
  // them) and RPC latencies exist.
  const std::string tokens = c.WriteFile("tokens.bin", PhraseTokenFile(3, 32, 6, 2, 9, 400));
  const std::string spec = c.WriteFile(
      "dash.yaml",
      absl::StrCat("name: dashboard\n"
                   "model:\n  builtin: {family: gpt, vocab: 32, d_model: 8, layers: 2, heads: 2, "
                   "seq: 8, seed: 1}\n"
                   "split: {stages: 2}\nschedule: {kind: 1F1B, microbatches: 2}\n"
                   "placement: {replicas: 2, shard: parameters}\n"
                   "training: {batch_size: 8, steps: 2, loss: cross_entropy, "
                   "grad_clip: {max_norm: 1}}\n"
                   "data: {kind: tokens, path: ",
                   tokens, ", eos: 31}\n", "eval: {every_steps: 1, data: {kind: tokens, path: ",
                   tokens, ", seed: 7, eos: 31}}\n"));
  CommandResult submit = c.Stagectl({"submit", spec, "--wait"});
  ASSERT_EQ(submit.exit_code, 0) << submit.out << submit.err << c.Logs();

  // The job gauges follow on the coordinator's 100 ms tick: scrape until the job is counted.
  Exported exported;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  for (;;) {
    exported = Exported();
    for (const std::string& endpoint : endpoints) {
      auto samples = Scrape(endpoint);
      ASSERT_TRUE(samples.ok()) << samples.status();
      exported.Add(*samples);
    }
    auto loss = exported.labels_by_name.find("stagecoach_loss");
    if ((loss != exported.labels_by_name.end() && loss->second.count("job")) ||
        absl::Now() > deadline) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }

  // Labels Prometheus adds or renames on scraping: `instance` and `job` (the scrape target's),
  // and `exported_job` for a series' own `job` label, which clashes with the target's.
  std::vector<std::string> missing_metrics, missing_labels;
  for (const auto& [title, expr] : queries) {
    const std::set<std::string> names = MetricNames(expr);
    std::set<std::string> labels_there;
    for (const std::string& name : names) {
      auto it = exported.labels_by_name.find(name);
      if (it == exported.labels_by_name.end()) {
        missing_metrics.push_back(absl::StrCat(name, " (panel '", title, "')"));
        continue;
      }
      labels_there.insert(it->second.begin(), it->second.end());
    }
    for (const std::string& label : LabelNames(expr)) {
      if (label == "instance" || label == "job") continue;
      const std::string own = label == "exported_job" ? "job" : label;
      if (!labels_there.count(own)) {
        missing_labels.push_back(
            absl::StrCat(label, " on ", absl::StrJoin(names, ", "), " (panel '", title, "')"));
      }
    }
  }
  std::vector<std::string> all_names;
  for (const auto& [name, labels] : exported.labels_by_name) all_names.push_back(name);
  EXPECT_TRUE(missing_metrics.empty()) << "the dashboard queries metrics no daemon exports:\n  "
                                       << absl::StrJoin(missing_metrics, "\n  ")
                                       << "\nexported:\n  " << absl::StrJoin(all_names, "\n  ");
  EXPECT_TRUE(missing_labels.empty())
      << "the dashboard groups or filters by labels those metrics do not carry:\n  "
      << absl::StrJoin(missing_labels, "\n  ");
}

// ---------------------------------------------------------------------------------------------
// The Dockerfiles.

const char* const kDockerfiles[] = {
    "deploy/docker/coordinator.Dockerfile",
    "deploy/docker/worker-cpu.Dockerfile",
    "deploy/docker/worker-cuda.Dockerfile",
};

struct Instruction {
  std::string keyword;  // upper case
  std::vector<std::string> args;
  std::string text;  // the arguments as written, continuations joined
};

struct Stage {
  std::string base;
  std::string name;
  std::vector<Instruction> instructions;
};

// Splits `text` on whitespace, keeping JSON-array arguments (["a", "b"]) as their elements.
std::vector<std::string> Words(const std::string& text) {
  std::string t(absl::StripAsciiWhitespace(text));
  if (absl::StartsWith(t, "[")) {
    auto json = nlohmann::json::parse(t, nullptr, false);
    if (json.is_array()) {
      std::vector<std::string> out;
      for (const auto& e : json) out.push_back(e.is_string() ? e.get<std::string>() : e.dump());
      return out;
    }
  }
  return absl::StrSplit(t, absl::ByAnyChar(" \t"), absl::SkipEmpty());
}

// The stages of a Dockerfile: comments dropped, `\` continuations joined.
std::vector<Stage> ParseDockerfile(const std::string& text) {
  std::vector<std::string> logical;
  std::string current;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    absl::string_view stripped = absl::StripAsciiWhitespace(line);
    if (absl::StartsWith(stripped, "#")) continue;
    if (absl::ConsumeSuffix(&stripped, "\\")) {
      absl::StrAppend(&current, stripped, " ");
      continue;
    }
    absl::StrAppend(&current, stripped);
    if (!absl::StripAsciiWhitespace(current).empty()) logical.push_back(current);
    current.clear();
  }
  std::vector<Stage> stages;
  for (const std::string& l : logical) {
    const size_t space = l.find_first_of(" \t");
    Instruction ins;
    ins.keyword = absl::AsciiStrToUpper(l.substr(0, space));
    ins.text = space == std::string::npos ? "" : l.substr(space + 1);
    ins.args = Words(ins.text);
    if (ins.keyword == "FROM") {
      Stage s;
      s.base = ins.args.empty() ? "" : ins.args[0];
      if (ins.args.size() >= 3 && absl::AsciiStrToUpper(ins.args[1]) == "AS") s.name = ins.args[2];
      stages.push_back(s);
      continue;
    }
    if (!stages.empty()) stages.back().instructions.push_back(ins);
  }
  return stages;
}

// COPY's sources and destination, flags (--from=..., --chown=...) set apart.
struct Copy {
  std::string from;  // empty: the build context
  std::vector<std::string> sources;
  std::string dest;
};

Copy ParseCopy(const Instruction& ins) {
  Copy c;
  std::vector<std::string> paths;
  for (const std::string& a : ins.args) {
    if (absl::StartsWith(a, "--from=")) {
      c.from = a.substr(7);
    } else if (!absl::StartsWith(a, "--")) {
      paths.push_back(a);
    }
  }
  if (!paths.empty()) {
    c.dest = paths.back();
    paths.pop_back();
  }
  c.sources = paths;
  return c;
}

// .dockerignore patterns at the repository root (the build context).
std::vector<std::string> DockerIgnorePatterns() {
  std::vector<std::string> patterns;
  for (absl::string_view line : absl::StrSplit(ReadFile(RepoRoot() + "/.dockerignore"), '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || absl::StartsWith(line, "#")) continue;
    patterns.emplace_back(line);
  }
  return patterns;
}

// Whether `path` (relative to the context) or a folder above it matches a pattern. Only the
// forms .dockerignore here uses: a plain path, a `*` in the last element, and a `**/` prefix.
bool Ignored(const std::string& path, const std::vector<std::string>& patterns) {
  auto glob = [](const std::string& pattern, const std::string& text) {
    std::string re;
    for (char ch : pattern) {
      if (ch == '*') {
        re += "[^/]*";
      } else if (std::string(".+?()[]{}^$|\\").find(ch) != std::string::npos) {
        re += std::string("\\") + ch;
      } else {
        re += ch;
      }
    }
    return std::regex_match(text, std::regex(re));
  };
  std::vector<std::string> prefixes;
  std::string prefix;
  for (absl::string_view part : absl::StrSplit(path, '/', absl::SkipEmpty())) {
    prefix = prefix.empty() ? std::string(part) : absl::StrCat(prefix, "/", part);
    prefixes.push_back(prefix);
  }
  for (const std::string& pattern : patterns) {
    if (absl::StartsWith(pattern, "!")) continue;
    absl::string_view rest = pattern;
    const bool any_depth = absl::ConsumePrefix(&rest, "**/");
    const std::string p(rest);
    for (const std::string& candidate : prefixes) {
      if (glob(p, candidate)) return true;
      if (any_depth && glob(p, fs::path(candidate).filename().string())) return true;
    }
  }
  return false;
}

// CMake targets defined in the source tree: name -> folder of the CMakeLists.txt, relative to
// the repository root ("" for the top level).
std::map<std::string, std::string> CMakeTargets() {
  std::map<std::string, std::string> targets;
  static const std::regex kAdd("add_(executable|library)\\s*\\(\\s*([A-Za-z0-9_.+-]+)");
  const fs::path root(RepoRoot());
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator();
       ++it) {
    const std::string rel = fs::relative(it->path(), root).string();
    if (it->is_directory() && (absl::StartsWith(rel, "build") || absl::StartsWith(rel, "."))) {
      it.disable_recursion_pending();
      continue;
    }
    if (it->path().filename() != "CMakeLists.txt") continue;
    const std::string text = ReadFile(it->path().string());
    const std::string dir = fs::relative(it->path().parent_path(), root).string();
    for (auto m = std::sregex_iterator(text.begin(), text.end(), kAdd); m != std::sregex_iterator();
         ++m) {
      targets[(*m)[2].str()] = dir == "." ? "" : dir;
    }
  }
  return targets;
}

// Targets named after `--target` in the stage's RUN commands (until the next flag or `&&`).
std::vector<std::string> BuiltTargets(const Stage& stage) {
  std::vector<std::string> out;
  for (const Instruction& ins : stage.instructions) {
    if (ins.keyword != "RUN") continue;
    for (size_t i = 0; i < ins.args.size(); ++i) {
      if (ins.args[i] != "--target") continue;
      for (size_t j = i + 1; j < ins.args.size(); ++j) {
        const std::string& a = ins.args[j];
        if (absl::StartsWith(a, "-") || a == "&&" || a == ";" || a == "\\") break;
        out.push_back(a);
      }
    }
  }
  return out;
}

// The packages of every `apt-get install` in the stage.
std::vector<std::string> AptPackages(const Stage& stage) {
  std::vector<std::string> out;
  for (const Instruction& ins : stage.instructions) {
    if (ins.keyword != "RUN") continue;
    for (size_t i = 0; i + 1 < ins.args.size(); ++i) {
      if (ins.args[i] != "apt-get" || ins.args[i + 1] != "install") continue;
      for (size_t j = i + 2; j < ins.args.size(); ++j) {
        const std::string& a = ins.args[j];
        if (a == "&&" || a == ";") break;
        if (!absl::StartsWith(a, "-")) out.push_back(a);
      }
    }
  }
  return out;
}

// scripts/lib.sh's STAGECOACH_PACKAGES.
std::set<std::string> LibShPackages() {
  const std::string text = ReadFile(RepoRoot() + "/scripts/lib.sh");
  const size_t start = text.find("STAGECOACH_PACKAGES=(");
  const size_t end = text.find(')', start);
  std::set<std::string> out;
  if (start == std::string::npos || end == std::string::npos) return out;
  const std::string body = text.substr(start + 21, end - start - 21);
  for (absl::string_view line : absl::StrSplit(body, '\n')) {
    line = line.substr(0, line.find('#'));
    for (absl::string_view w : absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty())) {
      out.emplace(w);
    }
  }
  return out;
}

class DockerfileTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    path_ = GetParam();
    const std::string text = ReadFile(RepoRoot() + "/" + path_);
    ASSERT_FALSE(text.empty()) << path_ << " is missing or empty";
    stages_ = ParseDockerfile(text);
    ASSERT_GE(stages_.size(), 2u) << path_ << ": expected a multi-stage build";
  }

  std::string path_;
  std::vector<Stage> stages_;
};

TEST_P(DockerfileTest, CopySourcesExistInTheContextAndAreNotIgnored) {
  const std::vector<std::string> ignore = DockerIgnorePatterns();
  ASSERT_FALSE(ignore.empty()) << ".dockerignore at the repository root is missing or empty";
  EXPECT_TRUE(Ignored("build", ignore)) << ".dockerignore must keep build/ out of the context";
  int context_copies = 0;
  for (const Stage& stage : stages_) {
    for (const Instruction& ins : stage.instructions) {
      if (ins.keyword == "ADD") ADD_FAILURE() << path_ << ": use COPY, not ADD: " << ins.text;
      if (ins.keyword != "COPY") continue;
      const Copy copy = ParseCopy(ins);
      EXPECT_FALSE(copy.sources.empty()) << path_ << ": COPY " << ins.text;
      if (!copy.from.empty()) continue;
      for (const std::string& source : copy.sources) {
        ++context_copies;
        EXPECT_TRUE(fs::exists(fs::path(RepoRoot()) / source))
            << path_ << ": COPY source '" << source << "' does not exist in the repository";
        EXPECT_FALSE(Ignored(source, ignore))
            << path_ << ": COPY source '" << source << "' is left out by .dockerignore";
      }
    }
  }
  EXPECT_GT(context_copies, 0) << path_ << " copies nothing from the repository";
}

TEST_P(DockerfileTest, BuiltTargetsAreCMakeTargetsWithTheirSourcesCopied) {
  const auto targets = CMakeTargets();
  ASSERT_TRUE(targets.count("stagecoach-coordinator")) << "no targets found under " << RepoRoot();
  int built = 0;
  for (size_t s = 0; s < stages_.size(); ++s) {
    const Stage& stage = stages_[s];
    std::vector<std::string> copied;
    for (const Instruction& ins : stage.instructions) {
      if (ins.keyword != "COPY") continue;
      const Copy copy = ParseCopy(ins);
      if (copy.from.empty()) copied.insert(copied.end(), copy.sources.begin(), copy.sources.end());
    }
    for (const std::string& target : BuiltTargets(stage)) {
      ++built;
      auto it = targets.find(target);
      if (it == targets.end()) {
        ADD_FAILURE() << path_ << ": --target " << target << " is not a CMake target";
        continue;
      }
      const std::string& dir = it->second;
      bool dir_copied = false;
      for (const std::string& c : copied) {
        std::string src(absl::StripSuffix(c, "/"));
        if (src == "." || src == dir || absl::StartsWith(dir, src + "/")) dir_copied = true;
      }
      EXPECT_TRUE(dir_copied) << path_ << ": builds " << target << " (defined in " << dir
                              << "/CMakeLists.txt) without copying " << dir;
      // The binary the runtime stage takes: /build/<folder>/<target>, which is where this build
      // tree has it too.
      const std::string in_image = absl::StrCat("/build/", dir, "/", target);
      bool taken = false;
      for (size_t r = s + 1; r < stages_.size(); ++r) {
        for (const Instruction& ins : stages_[r].instructions) {
          if (ins.keyword != "COPY") continue;
          const Copy copy = ParseCopy(ins);
          if (copy.from != stage.name) continue;
          for (const std::string& src : copy.sources) taken |= src == in_image;
        }
      }
      EXPECT_TRUE(taken) << path_ << ": no later stage copies " << in_image << " from "
                         << stage.name;
      EXPECT_TRUE(fs::exists(fs::path(BinaryDir()) / dir / target))
          << "the build tree has no " << dir << "/" << target << ": is " << in_image
          << " where CMake puts it?";
    }
  }
  EXPECT_GT(built, 0) << path_ << " builds no --target";
}

// The top-level CMakeLists.txt includes files of the repository (cmake/layering.cmake): a builder
// that copies CMakeLists.txt without them fails at its first cmake.
TEST_P(DockerfileTest, BuildersCopyTheFilesTheTopLevelCMakeListsIncludes) {
  static const std::regex kInclude("\\binclude\\s*\\(\\s*([A-Za-z0-9_./-]+\\.cmake)\\s*\\)");
  const std::string text = ReadFile(RepoRoot() + "/CMakeLists.txt");
  std::vector<std::string> included;
  for (auto m = std::sregex_iterator(text.begin(), text.end(), kInclude);
       m != std::sregex_iterator(); ++m) {
    included.push_back((*m)[1].str());
  }
  ASSERT_FALSE(included.empty()) << "the top-level CMakeLists.txt includes no .cmake file";
  for (const Stage& stage : stages_) {
    if (BuiltTargets(stage).empty()) continue;
    for (const std::string& file : included) {
      bool copied = false;
      for (const Instruction& ins : stage.instructions) {
        if (ins.keyword != "COPY") continue;
        const Copy copy = ParseCopy(ins);
        if (!copy.from.empty()) continue;
        for (const std::string& c : copy.sources) {
          std::string src(absl::StripSuffix(c, "/"));
          copied |= src == "." || src == file || absl::StartsWith(file, src + "/");
        }
      }
      EXPECT_TRUE(copied) << path_ << ": the top-level CMakeLists.txt includes " << file
                          << ", which stage " << stage.name << " does not copy";
    }
  }
}

TEST_P(DockerfileTest, BuilderInstallsScriptsLibShPackagesOnly) {
  const std::set<std::string> lib_sh = LibShPackages();
  ASSERT_FALSE(lib_sh.empty()) << "could not read STAGECOACH_PACKAGES from scripts/lib.sh";
  // Tools only an image build needs: fetching LibTorch, TLS roots for it.
  const std::set<std::string> image_only = {"ca-certificates", "curl", "unzip"};
  bool found_builder = false;
  for (const Stage& stage : stages_) {
    if (BuiltTargets(stage).empty()) continue;
    found_builder = true;
    const std::vector<std::string> packages = AptPackages(stage);
    EXPECT_FALSE(packages.empty()) << path_ << ": the builder installs no Debian packages";
    for (const std::string& p : packages) {
      EXPECT_TRUE(lib_sh.count(p) || image_only.count(p))
          << path_ << ": builder package '" << p << "' is not in scripts/lib.sh";
    }
    const bool builds_worker = absl::c_linear_search(BuiltTargets(stage), "stagecoach-worker");
    const bool has_torch = absl::c_linear_search(packages, "libtorch-dev");
    if (!builds_worker) {
      EXPECT_FALSE(has_torch) << path_ << ": the coordinator image needs no LibTorch";
      bool worker_off = false;
      for (const Instruction& ins : stage.instructions) {
        worker_off |= absl::StrContains(ins.text, "-DSTAGECOACH_BUILD_WORKER=OFF");
      }
      EXPECT_TRUE(worker_off) << path_ << ": configure with -DSTAGECOACH_BUILD_WORKER=OFF so that "
                              << "CMake does not look for LibTorch";
    }
  }
  EXPECT_TRUE(found_builder) << path_ << ": no stage builds a target";
}

TEST_P(DockerfileTest, RuntimeStageRunsTheDaemonAsANumericNonRootUser) {
  const Stage& runtime = stages_.back();
  std::string user, entrypoint;
  std::vector<std::string> exposed;
  for (const Instruction& ins : runtime.instructions) {
    if (ins.keyword == "USER") user = ins.text;
    if (ins.keyword == "ENTRYPOINT") entrypoint = ins.args.empty() ? "" : ins.args[0];
    if (ins.keyword == "EXPOSE") exposed.insert(exposed.end(), ins.args.begin(), ins.args.end());
  }
  ASSERT_FALSE(user.empty()) << path_ << ": the runtime stage sets no USER";
  const std::string uid = user.substr(0, user.find(':'));
  int id = -1;
  EXPECT_TRUE(absl::SimpleAtoi(uid, &id))
      << path_ << ": USER " << user << " is not numeric (Kubernetes runAsNonRoot needs it)";
  EXPECT_GT(id, 0) << path_ << ": USER " << user << " is root";
  EXPECT_TRUE(absl::StartsWith(entrypoint, "/usr/local/bin/stagecoach-"))
      << path_ << ": ENTRYPOINT " << entrypoint;
  EXPECT_EQ(exposed.size(), 2u) << path_ << ": EXPOSE the gRPC and the metrics port";
  bool binary_copied = false;
  for (const Instruction& ins : runtime.instructions) {
    if (ins.keyword != "COPY") continue;
    const Copy copy = ParseCopy(ins);
    for (const std::string& src : copy.sources) {
      if (fs::path(src).filename() == fs::path(entrypoint).filename() &&
          absl::StartsWith(entrypoint, copy.dest)) {
        binary_copied = true;
      }
    }
  }
  EXPECT_TRUE(binary_copied) << path_ << ": the runtime stage does not copy " << entrypoint;
}

INSTANTIATE_TEST_SUITE_P(Images, DockerfileTest, ::testing::ValuesIn(kDockerfiles),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string name = fs::path(info.param).stem().string();
                           for (char& ch : name) {
                             if (!absl::ascii_isalnum(ch)) ch = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace stagecoach::testing::deploy_files_test
