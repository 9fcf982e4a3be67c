// Admission limits and bounded planning: the hostile specs of the report (a million-layer GPT,
// microbatches of INT_MAX, 10,000 stages, sizes whose parameter counts overflow) are refused
// at once naming the field and the limit; the split search is near-linear in layers and gives
// the cuts of the dynamic programme it replaced; planning stops at its deadline or when its
// client goes away; long refusals are summarised to fit a gRPC trailer.
#include <fstream>
#include <iterator>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/rpc/status_conversion.h"
#include "common/spec/spec_limits.h"
#include "common/spec/spec_parser.h"
#include "common/util/utf8.h"
#include "coordinator/lifecycle/admission.h"
#include "coordinator/planning/planner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/test_paths.h"
#include "tests/unit/coordinator_test_fakes.h"

namespace stagecoach::coordinator::admission_limits_test {
namespace {

using ::testing::HasSubstr;

// The O(stages x layers^2) dynamic programme the planner used, as the reference for its cuts.
std::vector<int> ReferencePartition(const std::vector<int64_t>& costs, int stages) {
  const int n = static_cast<int>(costs.size());
  std::vector<int64_t> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  const int64_t inf = INT64_MAX;
  std::vector<std::vector<int64_t>> best(stages + 1, std::vector<int64_t>(n + 1, inf));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= stages; ++k) {
    for (int i = k; i <= n; ++i) {
      for (int j = k - 1; j < i; ++j) {
        if (best[k - 1][j] == inf) continue;
        const int64_t cost = std::max(best[k - 1][j], prefix[i] - prefix[j]);
        if (cost < best[k][i]) {
          best[k][i] = cost;
          cut[k][i] = j;
        }
      }
    }
  }
  std::vector<int> firsts(stages);
  for (int k = stages, i = n; k >= 1; --k) {
    firsts[k - 1] = cut[k][i];
    i = cut[k][i];
  }
  return firsts;
}

TEST(SplitSearch, GivesTheCutsOfTheDynamicProgrammeOnRandomCosts) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 400; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 40);
    const int stages = 1 + static_cast<int>(rng() % n);
    const int64_t range = trial % 3 == 0 ? 3 : 1000;  // many ties, or few
    std::vector<int64_t> costs(n);
    for (int64_t& c : costs) c = static_cast<int64_t>(rng() % range) + (trial % 5 == 0 ? 0 : 1);
    ASSERT_EQ(PartitionBalanced(costs, stages), ReferencePartition(costs, stages))
        << "trial " << trial << ": " << n << " layers, " << stages << " stages";
  }
}

TEST(SplitSearch, HandlesTheLargestAdmittedModelAndStopsWhenAsked) {
  const spec::SpecLimits limits;
  const std::vector<int64_t> costs(static_cast<size_t>(limits.max_layers), 1);
  auto firsts = PartitionBalanced(costs, 64, PlanOptions{});
  ASSERT_TRUE(firsts.ok());
  EXPECT_EQ(firsts->size(), 64u);
  // 100,000 = 64 x 1562.5: stages of 1562 and 1563 layers, the later ones longer.
  EXPECT_EQ(firsts->back(), limits.max_layers - 1563);
  EXPECT_EQ((*firsts)[1], 1562);

  PlanOptions gone;
  gone.cancelled = [] { return true; };
  EXPECT_TRUE(absl::IsCancelled(PartitionBalanced(costs, 64, gone).status()));
  PlanOptions late;
  late.deadline = absl::Now() - absl::Seconds(1);
  auto expired = PartitionBalanced(costs, 64, late);
  EXPECT_TRUE(absl::IsDeadlineExceeded(expired.status()));
  EXPECT_THAT(std::string(expired.status().message()), HasSubstr("--plan-timeout"));
}

std::string Repeat(const std::string& piece, int times) {
  std::string out;
  for (int i = 0; i < times; ++i) out += piece;
  return out;
}

absl::Status Admit(const std::string& yaml) {
  WorkerRegistry registry(absl::Seconds(10));
  FakeWorkerClient workers;
  Admission admission(AdmissionOptions{}, &registry, &workers);
  return admission.AdmitTraining(yaml, "spec.yaml").status();
}

std::string Gpt(const std::string& dims, const std::string& rest = "") {
  return absl::StrCat("name: t\nmodel: {builtin: {family: gpt, ", dims,
                      "}}\nsplit: {stages: 2}\nschedule: {kind: GPipe, microbatches: 2}\n",
                      "training: {batch_size: 4, steps: 1}\ndata: {kind: synthetic}\n", rest);
}

// Each case of the report, refused at admission naming the field and the limit.
TEST(AdmissionLimits, HostileSpecsAreRefusedNamingTheFieldAndTheLimit) {
  const absl::Time start = absl::Now();
  const struct {
    std::string yaml;
    std::string says;
  } cases[] = {
      {Gpt("vocab: 16, d_model: 8, layers: 1000000, heads: 2, seq: 8"),
       "model.builtin.layers: 1000003 is over the limit of 100000 layers (the coordinator's "
       "--max-layers)"},
      {Gpt("vocab: 16, d_model: 8, layers: 100000000, heads: 2, seq: 8"), "--max-layers"},
      {Gpt("vocab: 2147483647, d_model: 2147483647, layers: 2, heads: 1, seq: 8"),
       "model.builtin.vocab: 2147483647 is over the limit of 16777216"},
      {Gpt("vocab: 16777216, d_model: 16777216, layers: 2, heads: 1, seq: 8"),
       "parameters (the coordinator's --max-parameters)"},
      {"name: t\nmodel: {builtin: {family: mlp, sizes: [4, 8, 2]}}\nsplit: {stages: 2}\n"
       "schedule: {kind: GPipe, microbatches: 2147483647}\ntraining: {batch_size: 2147483647}\n",
       "schedule.microbatches: 2147483647 is over the limit of 65536 microbatches"},
      {"name: t\nmodel: {builtin: {family: mlp, sizes: [4, 8, 2]}}\nsplit: {stages: 2}\n"
       "schedule: {kind: GPipe, microbatches: 10000000}\ntraining: {batch_size: 10000000}\n",
       "--max-microbatches"},
      {absl::StrCat("name: t\nmodel: {builtin: {family: mlp, sizes: [4", Repeat(", 4", 10000),
                    "]}}\nsplit: {stages: 10000}\n"
                    "schedule: {kind: GPipe, microbatches: 2}\ntraining: {batch_size: 4}\n"),
       "split.stages: 10000 is over the limit of 1024 stages"},
      {"name: t\nmodel: {builtin: {family: mlp, sizes: [4, 8, 2]}}\n"
       "placement: {workers: 5000}\nschedule: {kind: GPipe, microbatches: 2}\n"
       "training: {batch_size: 4}\n",
       "placement.workers: 5000 is over the limit of 4096 workers"},
      {"name: t\nmodel: {builtin: {family: mlp, sizes: [4, 8, 8, 8, 8, 8, 8, 8, 2]}}\n"
       "split: {stages: 8}\nschedule: {kind: 1F1B, microbatches: 2}\n"
       "training: {batch_size: 4096}\nplacement: {workers: 8, replicas: 1024}\n",
       "placement.workers x placement.replicas: 8192 is over the limit of 4096 workers"},
  };
  for (const auto& c : cases) {
    const absl::Status refused = Admit(c.yaml);
    EXPECT_TRUE(absl::IsInvalidArgument(refused)) << c.yaml << "\n" << refused;
    EXPECT_THAT(std::string(refused.message()), HasSubstr(c.says)) << c.yaml;
  }
  // None of them was planned: all refused in far less than the minutes planning took.
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
}

TEST(AdmissionLimits, SchedulesOverTheActionLimitAreRefusedBeforeTheyAreBuilt) {
  // 8 stages x 65536 microbatches are each within their limits, not together.
  const absl::Status refused = Admit(
      "name: t\nmodel: {builtin: {family: mlp, sizes: [4, 8, 8, 8, 8, 8, 8, 8, 2]}}\n"
      "split: {stages: 8}\nschedule: {kind: GPipe, microbatches: 65536}\n"
      "training: {batch_size: 65536}\n");
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr("8 stages x 65536 microbatches make up to 4194304 schedule actions, "
                        "over the limit of 4000000 (the coordinator's --max-actions)"));
  // The limit is the coordinator's to raise.
  auto spec = spec::ParseJobSpec(
      "name: t\nmodel: {builtin: {family: mlp, sizes: [4, 8, 8, 2]}}\nsplit: {stages: 2}\n"
      "schedule: {kind: GPipe, microbatches: 8}\ntraining: {batch_size: 8}\n",
      "spec.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  PlanOptions tight;
  tight.limits.max_actions = 100;
  EXPECT_THAT(
      std::string(PlanJob(*spec, BuiltinLayers(*spec->model.builtin), tight).status().message()),
      HasSubstr("--max-actions"));
  PlanOptions raised;
  raised.limits.max_actions = 128;
  auto plan = PlanJob(*spec, BuiltinLayers(*spec->model.builtin), raised);
  ASSERT_TRUE(plan.ok()) << plan.status();
  int64_t actions = 0;
  for (const auto& rank : plan->lowered) actions += static_cast<int64_t>(rank.size());
  EXPECT_LE(actions, 128) << "the bound before building holds";
}

TEST(AdmissionLimits, ParameterCountsAreCheckedNotOverflowed) {
  spec::BuiltinModel mlp;
  mlp.family = "mlp";
  mlp.sizes = {INT64_MAX / 2, 4};
  EXPECT_FALSE(spec::BuiltinLayerParameterCounts(mlp).ok());
  mlp.sizes = {3, 4};
  EXPECT_EQ(*spec::BuiltinLayerParameterCounts(mlp), std::vector<int64_t>{16});
}

// Found by tests/fuzz/spec_parser_fuzz: yaml-cpp 0.7's LoadAll never returned on these (it
// kept producing empty documents, its memory growing), so a 2-byte spec held a coordinator
// core. They are refused as YAML the parser cannot read.
TEST(HostileYaml, InputsThatLoopedTheYamlLibraryAreRefused) {
  for (const std::string name : {"yaml-cpp-loop-1", "yaml-cpp-loop-2"}) {
    std::ifstream in(
        absl::StrCat(testing::ConfigsDir(), "/../tests/fuzz/corpus/spec_parser/", name),
        std::ios::binary);
    ASSERT_TRUE(in) << name;
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto spec = spec::ParseJobSpec(text, name);
    ASSERT_FALSE(spec.ok()) << name;
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr("invalid YAML")) << name;
  }
  auto two = spec::ParseJobSpec(",\n", "spec.yaml");
  EXPECT_THAT(std::string(two.status().message()),
              HasSubstr("spec.yaml:1:1: invalid YAML: the parser cannot read past this point"));
}

TEST(ErrorText, LongRefusalsAreSummarisedToFitATrailer) {
  // 100,000 unknown keys' worth of errors.
  std::string message;
  for (int i = 0; i < 100000; ++i)
    absl::StrAppend(&message, i ? "\n" : "", "k", i, ": unknown key");
  const std::string summary = rpc::SummarizeErrorMessage(message);
  EXPECT_LE(summary.size(), rpc::kMaxEncodedErrorBytes);
  EXPECT_THAT(summary, HasSubstr("k0: unknown key\nk1: unknown key"));
  EXPECT_THAT(summary, HasSubstr("more errors ("));
  EXPECT_EQ(rpc::SummarizeErrorMessage("short"), "short");
  // One huge line (a CSV's grid) is cut at a UTF-8 boundary.
  std::string line;
  for (int i = 0; i < 5000; ++i) line += "\xC3\xA9";  // é
  const std::string cut = rpc::SummarizeErrorMessage(line);
  EXPECT_LE(cut.size(), rpc::kMaxEncodedErrorBytes);
  EXPECT_FALSE(util::FirstInvalidUtf8(cut).has_value());
  EXPECT_THAT(cut, HasSubstr("(cut: 10000 bytes in all)"));
}

TEST(ErrorText, InvalidUtf8IsFoundAndPlaced) {
  EXPECT_FALSE(util::FirstInvalidUtf8("name: t\nmodel: é\n").has_value());
  const std::string bad = "name: t\nmodel: \xFF\n";
  ASSERT_EQ(util::FirstInvalidUtf8(bad), 15u);
  EXPECT_EQ(util::DescribeByteAt(bad, 15), "line 2, column 8 (byte 15): 0xFF");
  EXPECT_TRUE(util::FirstInvalidUtf8("\xC0\x80").has_value()) << "overlong";
  EXPECT_TRUE(util::FirstInvalidUtf8("\xED\xA0\x80").has_value()) << "surrogate";
  EXPECT_TRUE(util::FirstInvalidUtf8("\xE2\x82").has_value()) << "truncated";
}

}  // namespace
}  // namespace stagecoach::coordinator::admission_limits_test
