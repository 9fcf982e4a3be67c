// `stagectl step` with ragged rows across worker processes: a paused built-in GPT job takes a
// JSON Lines batch of rows of every length from 1 to seq (documents, and inputs/targets objects
// with some targets ignored), then the same rows as numpy object arrays, which stagectl pads and
// sends with the rows' lengths. Each training step's loss, and the parameters of the checkpoint
// after them, equal unpipelined steps of the GPT of tests/support/reference_gpt.h on the same
// rows (each row alone, its loss normalised by the batch's counted targets) from the job's own
// step-0 checkpoint, within rtol 1e-5 + atol 1e-6. On a job with data.packing each microbatch runs
// cut to its own longest row (the activations change shape per microbatch); on a windows job the
// batch runs cut to its longest. A bad line is refused by stagectl naming it, and the job is
// untouched.
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/job_predicates.h"
#include "tests/support/local_cluster.h"
#include "tests/support/python.h"
#include "tests/support/reference_documents.h"
#include "tests/support/reference_gpt.h"
#include "tests/support/stage_files.h"
#include "tests/support/step_zero.h"

namespace stagecoach::testing::ragged_client_step_test {
namespace {

constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;
constexpr int64_t kVocab = 32;
constexpr int64_t kSeq = 8;
constexpr int64_t kRows = 8;

struct Case {
  std::string name;
  std::string schedule;
  int stages;
  std::string data;  // the job's data: packing makes its shapes vary per microbatch
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// Rows of 1 to kSeq positions: even rows are documents (an array of ids: the targets are the
// next ids), odd rows objects whose first target is ignored.
struct ClientRows {
  std::string jsonl;
  DocumentBatch batch;  // the reference's: padded, targets -100 past each row, one segment
};

ClientRows MakeRows() {
  std::mt19937 rng(77);
  ClientRows out;
  out.batch.inputs = torch::zeros({kRows, kSeq}, torch::kInt64);
  out.batch.targets = torch::full({kRows, kSeq}, kReferenceIgnored, torch::kInt64);
  out.batch.segments = torch::full({kRows, kSeq}, -1, torch::kInt64);
  const int64_t lengths[kRows] = {3, 8, 1, 5, 2, 7, 4, 6};
  for (int64_t r = 0; r < kRows; ++r) {
    const int64_t n = lengths[r];
    std::vector<int64_t> ids(static_cast<size_t>(n) + 1);
    for (int64_t& id : ids) id = static_cast<int64_t>(rng() % kVocab);
    std::vector<int64_t> x(ids.begin(), ids.end() - 1), y(ids.begin() + 1, ids.end());
    if (r % 2 == 1) y[0] = kReferenceIgnored;
    absl::StrAppend(&out.jsonl,
                    r % 2 == 0 ? nlohmann::json(ids).dump()
                               : nlohmann::json{{"inputs", x}, {"targets", y}}.dump(),
                    "\n");
    for (int64_t i = 0; i < n; ++i) {
      out.batch.inputs[r][i] = x[i];
      out.batch.targets[r][i] = y[i];
      out.batch.segments[r][i] = 0;
    }
  }
  return out;
}

// `batch`'s rows (each cut to its length) as numpy object arrays of int64 rows at `x` and `y`.
void SaveObjectArrays(const DocumentBatch& batch, const std::string& x, const std::string& y) {
  std::vector<std::string> xs, ys;
  for (int64_t r = 0; r < batch.inputs.size(0); ++r) {
    const int64_t n = batch.segments[r].ne(-1).sum().item<int64_t>();
    std::vector<int64_t> in, target;
    for (int64_t i = 0; i < n; ++i) {
      in.push_back(batch.inputs[r][i].item<int64_t>());
      target.push_back(batch.targets[r][i].item<int64_t>());
    }
    xs.push_back(absl::StrCat("[", absl::StrJoin(in, ", "), "]"));
    ys.push_back(absl::StrCat("[", absl::StrJoin(target, ", "), "]"));
  }
  const std::string script = absl::StrCat(
      "import numpy as np, sys\n"
      "def save(path, rows):\n"
      "    a = np.empty(len(rows), dtype=object)\n"
      "    for i, r in enumerate(rows): a[i] = np.array(r, dtype=np.int64)\n"
      "    np.save(path, a, allow_pickle=True)\n"
      "save(sys.argv[1], [",
      absl::StrJoin(xs, ", "), "])\nsave(sys.argv[2], [", absl::StrJoin(ys, ", "), "])\n");
  const CommandResult made = RunCommand({kPython, "-c", script, x, y}, absl::Seconds(60));
  ASSERT_EQ(made.exit_code, 0) << made.err;
}

class RaggedClientStep : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!PythonCanImport("numpy")) GTEST_SKIP() << "Debian's python3-numpy is not installed";
    setenv("OMP_NUM_THREADS", "1", 1);
  }
};

TEST_P(RaggedClientStep, OneStepOnRaggedRowsEqualsTheReference) {
  const Case& c = GetParam();
  ClusterOptions options;
  options.workers = 2;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& cl = **cluster;
  std::string tokens;
  for (int i = 0; i < 400; ++i)
    tokens.push_back(static_cast<char>(i % kVocab)), tokens.push_back(0);
  const std::string data = cl.WriteFile("tokens.bin", tokens);
  const std::string ckpt = cl.dir() + "/ckpt";
  const std::string spec = cl.WriteFile(
      "spec.yaml",
      absl::StrCat("name: ", c.name, "\nmodel:\n  builtin: {family: gpt, vocab: ", kVocab,
                   ", d_model: 16, layers: 2, heads: 2, seq: ", kSeq, ", seed: 4}\n",
                   "split: {stages: ", c.stages, "}\n", "schedule: {kind: ", c.schedule,
                   ", microbatches: 4}\n", "placement: {workers: 2}\n",
                   "training:\n  batch_size: 8\n  steps: 5\n  loss: cross_entropy\n",
                   "  optimizer: {kind: sgd, lr: 0.1, momentum: 0.9}\n", "  checkpoint: {dir: ",
                   ckpt, "}\n", "data: {kind: tokens, path: ", data, c.data, "}\n"));
  std::string id;
  ASSERT_NO_FATAL_FAILURE(HoldAtAStepZeroCheckpoint(cl, spec, &id));
  auto checkpoint = [&](int n) {
    CommandResult r = cl.Stagectl({"checkpoint", id});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    auto written = cl.WaitForJob(
        id, [n](const v1::Job& j) { return IsFinal(j) || j.checkpoints_size() >= n; },
        absl::Seconds(60));
    ASSERT_TRUE(written.ok()) << written.status();
    ASSERT_EQ(written->checkpoints_size(), n) << written->reason();
  };

  const ClientRows rows = MakeRows();
  // A bad line is refused before anything is sent.
  CommandResult bad =
      cl.Stagectl({"step", id, "--inputs", cl.WriteFile("bad.jsonl", rows.jsonl + "[1, -3]\n")});
  EXPECT_EQ(bad.exit_code, 2) << bad.out << bad.err;
  EXPECT_NE(bad.err.find("bad.jsonl' line 9[1]: -3 is not an id"), std::string::npos) << bad.err;

  CommandResult step =
      cl.Stagectl({"step", id, "--inputs", cl.WriteFile("rows.jsonl", rows.jsonl), "-o", "json"});
  ASSERT_EQ(step.exit_code, 0) << step.out << step.err << cl.Logs();
  const nlohmann::json answer = nlohmann::json::parse(step.out);
  EXPECT_EQ(answer["global_step"], 0);
  // The same rows again as numpy object arrays (np.save of dtype=object arrays).
  const std::string x = cl.dir() + "/x.npy", y = cl.dir() + "/y.npy";
  ASSERT_NO_FATAL_FAILURE(SaveObjectArrays(rows.batch, x, y));
  CommandResult again = cl.Stagectl({"step", id, "--inputs", x, "--targets", y, "-o", "json"});
  ASSERT_EQ(again.exit_code, 0) << again.out << again.err << cl.Logs();
  const nlohmann::json second = nlohmann::json::parse(again.out);
  EXPECT_EQ(second["global_step"], 1);
  ASSERT_NO_FATAL_FAILURE(checkpoint(2));

  const GptReferenceConfig ref =
      SmallSgdGptReference(kVocab, kSeq, LoadAllStageFiles(ckpt, 0, c.stages));
  const GptReferenceResult want = TrainGptReferenceOnBatches(ref, {rows.batch, rows.batch});
  ASSERT_TRUE(answer["loss"].is_number()) << step.out;
  EXPECT_NEAR(answer["loss"].get<double>(), want.losses[0],
              kAtol + kRtol * std::abs(want.losses[0]));
  ASSERT_TRUE(second["loss"].is_number()) << again.out;
  EXPECT_NEAR(second["loss"].get<double>(), want.losses[1],
              kAtol + kRtol * std::abs(want.losses[1]));
  const std::map<std::string, torch::Tensor> after = LoadAllStageFiles(ckpt, 2, c.stages);
  EXPECT_EQ(after.size(), want.params.size());
  for (const auto& [name, p] : want.params) {
    ASSERT_EQ(after.count(name), 1u) << name;
    EXPECT_TRUE(torch::allclose(after.at(name), p, kRtol, kAtol))
        << name << " by " << (after.at(name) - p).abs().max().item<double>();
  }
  auto job = cl.GetJob(id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->global_steps_done(), 2);
  EXPECT_EQ(job->state(), v1::JOB_STATE_PAUSED);

  // The step's padding waste shows how far each microbatch was cut: to its own longest row with
  // data.packing, to the batch's longest (here the window) without.
  ASSERT_EQ(cl.Stagectl({"cancel", id}).exit_code, 0);
  ASSERT_TRUE(cl.WaitForJob(id, IsFinal, absl::Seconds(60)).ok());
  CommandResult watch = cl.Stagectl({"watch", id, "-o", "json"});
  const torch::Tensor lengths = rows.batch.segments.ne(-1).sum(1);
  const bool each = c.data.find("packing") != std::string::npos;
  int64_t computed = 0;
  for (int64_t mb = 0; mb < 4; ++mb) {
    computed += 2 * (each ? lengths.slice(0, 2 * mb, 2 * mb + 2).max().item<int64_t>() : kSeq);
  }
  const int64_t counted = rows.batch.targets.ne(kReferenceIgnored).sum().item<int64_t>();
  int events = 0;
  for (absl::string_view line : absl::StrSplit(watch.out, '\n', absl::SkipEmpty())) {
    const nlohmann::json event = nlohmann::json::parse(std::string(line), nullptr, false);
    if (event.is_discarded() || event.value("event", "") != "step_completed") continue;
    ++events;
    EXPECT_NEAR(event.at("padding_waste").get<double>(),
                1.0 - static_cast<double>(counted) / static_cast<double>(computed), 1e-9)
        << line;
  }
  EXPECT_EQ(events, 2) << watch.out << watch.err;
}

INSTANTIATE_TEST_SUITE_P(Jobs, RaggedClientStep,
                         ::testing::Values(Case{"packed-interleaved", "Interleaved1F1B", 4,
                                                ", eos: 31, packing: pad"},
                                           Case{"windows-1f1b", "1F1B", 2, ""}));

}  // namespace
}  // namespace stagecoach::testing::ragged_client_step_test
