// Elastic shrink's spec and planning (restart.elastic, coordinator/elastic/): which layouts of
// fewer workers keep the global batch in the same microbatches, the re-planned spec and plan,
// the refusal when none is possible; and the spec fields with their errors.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/spec/spec_parser.h"
#include "coordinator/elastic/elastic_plan.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/elastic_specs.h"
#include "tests/unit/spec_test_util.h"

namespace stagecoach::coordinator {
namespace {

using spec::Edit;
using spec::Errors;
using spec::kBase;
using spec::Parsed;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

bool Same(const ElasticLayout& a, const ElasticLayout& b) {
  return a.ranks == b.ranks && a.replicas == b.replicas && a.microbatches == b.microbatches &&
         a.stages == b.stages;
}

Plan Own(int ranks, int replicas, int microbatches, int stages_per_rank, int layers) {
  Plan plan;
  plan.num_ranks = ranks;
  plan.replicas = replicas;
  plan.num_microbatches = microbatches;
  plan.num_stages = ranks * stages_per_rank;
  plan.layers.resize(layers);
  return plan;
}

TEST(ElasticLayouts, FewerRanksKeepTheMicrobatchesAndCutTheLayersAgain) {
  const std::vector<ElasticLayout> layouts = ElasticLayouts(Own(4, 1, 4, 1, 8), 3, 1);
  ASSERT_EQ(layouts.size(), 3u);
  EXPECT_TRUE(Same(layouts[0], {3, 1, 4, 3}));
  EXPECT_TRUE(Same(layouts[1], {2, 1, 4, 2}));
  EXPECT_TRUE(Same(layouts[2], {1, 1, 4, 1}));
  EXPECT_EQ(ElasticLayouts(Own(4, 1, 4, 1, 8), 3, 2).size(), 2u) << "min_workers 2";
  // Two stages a rank (a V schedule): 3 ranks hold 6 stages, within 6 layers; 3 ranks of 8
  // layers' V would need more stages than layers with 2 layers.
  EXPECT_TRUE(Same(ElasticLayouts(Own(4, 1, 8, 2, 6), 3, 1)[0], {3, 1, 8, 6}));
  EXPECT_TRUE(Same(ElasticLayouts(Own(4, 1, 8, 2, 4), 3, 1)[0], {2, 1, 8, 4}));
}

TEST(ElasticLayouts, ReplicasGoBeforeRanksAndSplitTheSameMicrobatches) {
  // 2 ranks x 2 replicas of 2 microbatches each: on 3 workers, one replica of the 2-rank
  // pipeline runs all 4 microbatches (a 3rd replica is not possible: 4 is not divisible).
  const std::vector<ElasticLayout> layouts = ElasticLayouts(Own(2, 2, 2, 1, 4), 3, 1);
  ASSERT_EQ(layouts.size(), 3u);
  EXPECT_TRUE(Same(layouts[0], {2, 1, 4, 2}));
  EXPECT_TRUE(Same(layouts[1], {1, 2, 2, 1}));
  EXPECT_TRUE(Same(layouts[2], {1, 1, 4, 1}));
  // 3 replicas of one microbatch each on 2 workers: 2 replicas would split 3 microbatches.
  const std::vector<ElasticLayout> odd = ElasticLayouts(Own(1, 3, 1, 1, 2), 2, 1);
  ASSERT_EQ(odd.size(), 1u);
  EXPECT_TRUE(Same(odd[0], {1, 1, 3, 1}));
  EXPECT_TRUE(ElasticLayouts(Own(1, 3, 1, 1, 2), 2, 2).empty());
}

TEST(PlanOnWorkers, ThreeOfFourWorkersRunThreeStagesOfTheSameLayers) {
  const spec::JobSpec own_spec = Parsed(kFourStageElasticJob);
  auto own = PlanJob(own_spec);
  ASSERT_TRUE(own.ok()) << own.status();
  ASSERT_EQ(own->num_stages, 4);
  auto shrunk = PlanOnWorkers("job-1", kFourStageElasticJob, *own, 3, 2);
  ASSERT_TRUE(shrunk.ok()) << shrunk.status();
  EXPECT_EQ(shrunk->plan.num_ranks, 3);
  EXPECT_EQ(shrunk->plan.num_stages, 3);
  EXPECT_EQ(shrunk->plan.num_microbatches, 4);
  EXPECT_EQ(shrunk->plan.schedule_name, "1F1B");
  EXPECT_EQ(shrunk->plan.layers.size(), own->layers.size());
  EXPECT_EQ(shrunk->spec.placement.workers, 3);
  EXPECT_TRUE(shrunk->spec.split.points.empty()) << "the points cut 4 stages";
  EXPECT_EQ(shrunk->spec.training.batch_size, 16);
  EXPECT_TRUE(shrunk->spec.restart.elastic);
  EXPECT_EQ(shrunk->summary, "1F1B on 3 ranks x 1 replica, 3 stages, 4 microbatches");
  // The YAML is the spec the workers get: it reads back the same.
  EXPECT_EQ(Parsed(shrunk->spec_yaml).placement.workers, 3);

  auto none = PlanOnWorkers("job-1", kFourStageElasticJob, *own, 1, 2);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(none.status().message(),
              HasSubstr("job-1: cannot be planned on 1 workers (restart.min_workers 2)"));
}

TEST(PlanOnWorkers, AReplicatedJobLosesAReplicaAndKeepsItsGlobalBatch) {
  const std::string yaml = Edit(
      Edit(kFourStageElasticJob, "placement: {workers: 4}", "placement: {workers: 2, replicas: 2}"),
      "  points: {\"2\": beginning, \"4\": beginning, "
      "\"6\": beginning}\n",
      "  stages: 2\n");
  auto own = PlanJob(Parsed(yaml));
  ASSERT_TRUE(own.ok()) << own.status();
  auto shrunk = PlanOnWorkers("job-2", yaml, *own, 3, 2);
  ASSERT_TRUE(shrunk.ok()) << shrunk.status();
  EXPECT_EQ(shrunk->plan.num_ranks, 2);
  EXPECT_EQ(shrunk->plan.replicas, 1);
  EXPECT_EQ(shrunk->plan.num_microbatches, 8) << "both replicas' microbatches";
  EXPECT_EQ(shrunk->plan.num_stages, 2);
}

TEST(ElasticSpec, FieldsAndErrors) {
  const spec::JobSpec plain = Parsed(kBase);
  EXPECT_FALSE(plain.restart.elastic);
  const std::string with_restarts = absl::StrCat(kBase, "restart:\n  max_restarts: 1\n");
  const spec::JobSpec on = Parsed(absl::StrCat(with_restarts, "  elastic: true\n"));
  EXPECT_TRUE(on.restart.elastic);
  EXPECT_TRUE(on.restart.grow);
  EXPECT_EQ(on.restart.min_workers, 1);
  EXPECT_EQ(on.restart.wait, absl::Seconds(60));
  const spec::JobSpec tuned = Parsed(
      absl::StrCat(with_restarts, "  elastic: {grow: false}\n  min_workers: 2\n  wait: 2m\n"));
  EXPECT_TRUE(tuned.restart.elastic);
  EXPECT_FALSE(tuned.restart.grow);
  EXPECT_EQ(tuned.restart.min_workers, 2);
  EXPECT_EQ(tuned.restart.wait, absl::Minutes(2));
  EXPECT_EQ(Parsed(absl::StrCat(with_restarts, "  elastic: true\n  wait: 1.5\n")).restart.wait,
            absl::Milliseconds(1500));

  EXPECT_THAT(Errors(absl::StrCat(kBase, "restart: {elastic: true}\n")),
              ElementsAre(HasSubstr("restart.elastic: needs restart.max_restarts >= 1")));
  EXPECT_THAT(Errors(absl::StrCat(with_restarts, "  min_workers: 1\n")),
              ElementsAre("restart.min_workers: only valid with restart.elastic"));
  EXPECT_THAT(Errors(absl::StrCat(with_restarts, "  elastic: true\n  min_workers: 3\n")),
              ElementsAre("restart.min_workers: must be <= the job's 2 workers "
                          "(placement.workers x placement.replicas), got 3"));
  EXPECT_THAT(Errors(absl::StrCat(with_restarts, "  elastic: true\n  wait: soon\n")),
              ElementsAre(HasSubstr("restart.wait: must be a duration >= 0")));
  EXPECT_THAT(Errors(absl::StrCat(with_restarts, "  elastic: true\n  wait: -3s\n")),
              ElementsAre(HasSubstr("restart.wait: must be a duration >= 0")));
  EXPECT_THAT(Errors(absl::StrCat(with_restarts, "  elastic: {grwo: true}\n")),
              ElementsAre(HasSubstr("restart.elastic.grwo: unknown key")));
}

}  // namespace
}  // namespace stagecoach::coordinator
