// The planner: partitions, schedule plans, and what it refuses.
#include "coordinator/planning/planner.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/schedule/csv.h"
#include "common/schedule/lowering.h"
#include "common/schedule/validator.h"
#include "common/spec/spec_parser.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/test_paths.h"

namespace stagecoach::coordinator::planner_test {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

spec::JobSpec Parse(const std::string& extra, const std::string& sizes = "[4, 8, 8, 8, 2]",
                    const std::string& split = "{stages: 2}") {
  auto spec = spec::ParseJobSpec(
      absl::StrCat("name: t\nmodel: {builtin: {family: mlp, sizes: ", sizes, "}}\nsplit: ", split,
                   "\nschedule: {kind: GPipe, microbatches: 4}\ntraining: {batch_size: 8}\n",
                   extra),
      "t");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

TEST(PartitionBalanced, EqualCostsGiveEarlierStagesFewerLayers) {
  EXPECT_THAT(PartitionBalanced({1, 1, 1}, 2), ElementsAre(0, 1));
  EXPECT_THAT(PartitionBalanced({1, 1, 1, 1, 1, 1}, 4), ElementsAre(0, 1, 2, 4));
  EXPECT_THAT(PartitionBalanced({1, 1, 1, 1}, 4), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(PartitionBalanced({1, 1, 1, 1}, 1), ElementsAre(0));
}

TEST(PartitionBalanced, MinimisesTheMostExpensiveStage) {
  // Best split of 10|1 1 1|10 into 3: max 10, not 11.
  EXPECT_THAT(PartitionBalanced({10, 1, 1, 1, 10}, 3), ElementsAre(0, 1, 4));
  EXPECT_THAT(PartitionBalanced({100, 1, 1, 1, 1}, 2), ElementsAre(0, 1));
}

TEST(PlanJob, EqualParamsBalancesParameterCounts) {
  // Layers: 4*64+64=320, 64*4+4=260, 4*4+4=20, 4*4+4=20.
  spec::JobSpec spec = Parse("", "[4, 64, 4, 4, 4]", "{stages: 2, policy: equal-params}");
  auto plan = PlanJob(spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->stages[0].end_layer, 1);
  EXPECT_EQ(plan->stages[0].parameters, 320);
  EXPECT_EQ(plan->stages[1].parameters, 300);
  spec.split.policy = "equal-layers";
  EXPECT_EQ(PlanJob(spec)->stages[0].end_layer, 2);
}

TEST(PlanJob, PlansALoweredValidatedSchedulePerRank) {
  auto plan = PlanJob(Parse(""));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->num_stages, 2);
  EXPECT_EQ(plan->num_ranks, 2);
  EXPECT_THAT(plan->stage_to_rank, ElementsAre(0, 1));
  ASSERT_EQ(plan->lowered.size(), 2u);
  // Rank 1 receives each activation before using it and ends by reducing its gradients.
  EXPECT_EQ(plan->lowered[1].front()->ToString(), "1RECV_F0");
  EXPECT_EQ(plan->lowered[1].back()->ToString(), "1REDUCE_GRAD");
  // Workers default to stages when not given.
  EXPECT_EQ(PlanJob(Parse("placement: {workers: 2}", "[4, 8, 8, 8, 2]", "{policy: equal-layers}"))
                ->num_stages,
            2);
}

spec::JobSpec ParseGpt(const std::string& data, const std::string& loss = "cross_entropy") {
  auto spec = spec::ParseJobSpec(
      absl::StrCat("name: t\nmodel: {builtin: {family: gpt, vocab: 64, d_model: 32, layers: 4, "
                   "heads: 4, seq: 16}}\nsplit: {stages: 4}\n"
                   "schedule: {kind: 1F1B, microbatches: 4}\n"
                   "training: {batch_size: 8, loss: ",
                   loss, "}\n", data),
      "t");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

TEST(PlanJob, PlansAGptOnATokensFile) {
  spec::JobSpec spec = ParseGpt("data: {kind: tokens, path: train.bin}");
  // embed, blocks.0-3, norm, head.
  const int64_t d = 32, block = 12 * d * d + 13 * d;
  EXPECT_THAT(BuiltinLayerParameters(*spec.model.builtin),
              ElementsAre(64 * d + 16 * d, block, block, block, block, 2 * d, d * 64));
  auto plan = PlanJob(spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->stages.size(), 4u);
  // Seven layers in four stages under equal-layers (the spec's policy when none is given to
  // PlanJob). Their sizes are orders of magnitude apart (the norm's 64 parameters against a
  // block's 12,704), so they weigh by their parameters: embed b0 | b1 | b2 | b3 norm head, not
  // embed | b0 b1 | b2 b3 | norm head, which would leave a stage with no block.
  EXPECT_EQ(plan->split, "equal-layers");
  EXPECT_EQ(plan->stages[0].end_layer, 2);
  EXPECT_EQ(plan->stages[1].end_layer, 3);
  EXPECT_EQ(plan->stages[2].end_layer, 4);
  EXPECT_EQ(plan->stages[3].end_layer, 7);
  EXPECT_EQ(plan->stages[3].parameters, block + 2 * d + d * 64);
}

TEST(PlanJob, PlansAGptOnSyntheticTokens) {
  auto plan = PlanJob(ParseGpt(""));  // data.kind defaults to synthetic
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->stages.size(), 4u);
}

TEST(PlanJob, RefusesDataAndLossAGptCannotUse) {
  struct Case {
    std::string data, loss, want;
  };
  for (const Case& c : std::vector<Case>{
           {"data: {kind: tensors, path: x.pt}", "cross_entropy", "data.kind"},
           {"data: {kind: tokens, path: x.bin, seq: 3}", "cross_entropy",
            "data.seq: must equal model.builtin.seq"},
           {"data: {kind: tokens, path: x.bin}", "mse", "training.loss"},
       }) {
    spec::JobSpec spec = ParseGpt(c.data, c.loss);
    auto plan = PlanJob(spec);
    ASSERT_FALSE(plan.ok()) << c.want;
    EXPECT_TRUE(absl::IsInvalidArgument(plan.status()));
    EXPECT_THAT(std::string(plan.status().message()), HasSubstr(c.want));
  }
  spec::JobSpec no_path = ParseGpt("data: {kind: tokens, path: x.bin}");
  no_path.data.path.clear();
  EXPECT_THAT(std::string(PlanJob(no_path).status().message()), HasSubstr("data.path"));
  // An MLP cannot read tokens.
  EXPECT_THAT(std::string(PlanJob(Parse("data: {kind: tokens, path: x.bin}")).status().message()),
              HasSubstr("data.kind: 'tokens' data cannot feed a mlp model"));
}

TEST(PlanJob, PlansAnMlpOnATensorsFile) {
  // The file lives on the workers' filesystem; the planner only needs its path.
  auto plan = PlanJob(Parse("data: {kind: tensors, path: /data/train.pt}"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->stages.size(), 2u);

  spec::JobSpec no_path = Parse("data: {kind: tensors, path: x.pt}");
  no_path.data.path.clear();
  auto refused = PlanJob(no_path);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status()));
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("data.path: required for data.kind tensors"));
  // A GPT still reads tokens only.
  EXPECT_THAT(
      std::string(PlanJob(ParseGpt("data: {kind: tensors, path: x.pt}")).status().message()),
      HasSubstr("data.kind: 'tensors' data cannot feed a gpt model (use data.kind tokens, jsonl "
                "or synthetic)"));
  // Records (tokenized by the workers) feed a decoder.
  EXPECT_TRUE(PlanJob(ParseGpt("data: {kind: jsonl, path: t.jsonl, tokenizer: t.model}")).ok());
}

TEST(PlanJob, RefusesWhatCannotRunNamingTheField) {
  struct Case {
    std::string extra, split, want;
  };
  for (const Case& c : std::vector<Case>{
           {"placement: {workers: 3}", "{stages: 2}",
            "placement.workers: 2 stages do not divide evenly among 3 workers (split.stages "
            "must be a multiple of placement.workers)"},
           {"placement: {workers: 1}", "{stages: 2}",
            "schedule.kind: GPipe with 2 stages on 1 worker (2 per worker) and 4 microbatches: "
            "GPipe runs exactly one stage per rank, but stages_per_rank is 2"},
           {"data: {kind: tokens, path: x.bin}", "{stages: 2}", "data.kind"},
           {"", "{stages: 2, policy: profiled}",
            "split.policy: needs the layer times and sizes a worker's InspectModel profile "
            "measures"},
           {"", "{stages: 2, policy: memory}", "split.policy: needs the layer times and sizes"},
       }) {
    auto plan = PlanJob(Parse(c.extra, "[4, 8, 8, 8, 2]", c.split));
    ASSERT_FALSE(plan.ok()) << c.want;
    EXPECT_TRUE(absl::IsInvalidArgument(plan.status()));
    EXPECT_THAT(std::string(plan.status().message()), HasSubstr(c.want));
  }
  spec::JobSpec one_f_one_b = Parse("");
  one_f_one_b.schedule.kind = "1f1b";  // case-insensitive
  one_f_one_b.split.stages = 4;
  one_f_one_b.schedule.microbatches = 3;
  auto plan = PlanJob(one_f_one_b);
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(std::string(plan.status().message()),
              HasSubstr("schedule.kind: 1F1B with 4 stages on 4 workers (1 per worker) and 3 "
                        "microbatches: Number of microbatches (3) must be greater than or equal "
                        "to the number of stages (4)"));
  spec::JobSpec unknown = Parse("");
  unknown.schedule.kind = "Chimera";
  EXPECT_THAT(std::string(PlanJob(unknown).status().message()),
              HasSubstr("schedule.kind: unknown schedule 'Chimera'; valid schedules: GPipe, 1F1B, "
                        "Interleaved1F1B,"));
  spec::JobSpec zbv = Parse("");
  zbv.schedule.kind = "zbvzerobubble";
  zbv.placement.workers = 2;  // 2 stages on 2 workers: ZBV needs 2 per worker
  EXPECT_THAT(std::string(PlanJob(zbv).status().message()),
              HasSubstr("schedule.kind: ZBVZeroBubble with 2 stages on 2 workers (1 per worker) "
                        "and 4 microbatches: ZBV requires exactly 2 stages per rank, but got 1."));
  spec::JobSpec interleaved = Parse("");
  interleaved.schedule.kind = "Interleaved1F1B";
  interleaved.split.stages = 3;  // not a multiple of its 2 stages per worker
  EXPECT_THAT(std::string(PlanJob(interleaved).status().message()),
              HasSubstr("split.stages: Interleaved1F1B runs 2 stages per worker unless "
                        "placement.workers says otherwise, and 3 is not a multiple of 2"));
}

}  // namespace
}  // namespace stagecoach::coordinator::planner_test

namespace stagecoach::coordinator::planner_test {
namespace {

TEST(PlanJob, EveryExampleConfigPlans) {
  int planned = 0;
  for (const auto& entry : std::filesystem::directory_iterator(testing::ConfigsDir())) {
    if (entry.path().extension() != ".yaml") continue;
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    auto spec = spec::ParseJobSpec(text.str(), entry.path().string());
    ASSERT_TRUE(spec.ok()) << spec.status();
    auto plan = PlanJob(*spec);
    EXPECT_TRUE(plan.ok()) << entry.path() << ": " << plan.status();
    ++planned;
  }
  EXPECT_GE(planned, 4);
}

}  // namespace
}  // namespace stagecoach::coordinator::planner_test

namespace stagecoach::coordinator::planner_test {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A spec for `kind` on `workers` workers with `stages` stages (0: not given) and `m` microbatches,
// over an MLP of 8 layers.
spec::JobSpec KindSpec(const std::string& kind, int workers, int stages, int m) {
  std::string placement = workers > 0 ? absl::StrCat("placement: {workers: ", workers, "}\n") : "";
  std::string split = stages > 0 ? absl::StrCat("split: {stages: ", stages, "}\n") : "";
  auto spec = spec::ParseJobSpec(
      absl::StrCat("name: t\nmodel: {builtin: {family: mlp, sizes: [4, 8, 8, 8, 8, 8, 8, 8, 2]}}\n",
                   split, "schedule: {kind: ", kind, ", microbatches: ", m, "}\n", placement,
                   "training: {batch_size: 64}\n"),
      "t");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

bool NeedsOneStagePerRank(schedule::ScheduleKind kind) {
  return kind == schedule::ScheduleKind::kGPipe || kind == schedule::ScheduleKind::k1F1B;
}
bool NeedsTwoStagesPerRank(schedule::ScheduleKind kind) {
  return kind == schedule::ScheduleKind::kZBVZeroBubble ||
         kind == schedule::ScheduleKind::kDualPipeV || kind == schedule::ScheduleKind::kVHalf ||
         kind == schedule::ScheduleKind::kVMin;
}

TEST(PlanJob, EveryKindPlansWhereTheLibraryAllowsAndTheListsValidate) {
  for (schedule::ScheduleKind kind : schedule::AllScheduleKinds()) {
    const std::string name(schedule::ScheduleKindName(kind));
    for (int workers : {2, 4}) {
      for (int spr : {1, 2}) {
        const std::string what = absl::StrCat(name, " workers ", workers, " spr ", spr);
        auto plan = PlanJob(KindSpec(name, workers, workers * spr, 8));
        const bool refused =
            (spr == 2 && NeedsOneStagePerRank(kind)) || (spr == 1 && NeedsTwoStagesPerRank(kind));
        if (refused) {
          ASSERT_FALSE(plan.ok()) << what;
          EXPECT_TRUE(absl::IsInvalidArgument(plan.status())) << what;
          EXPECT_THAT(std::string(plan.status().message()), HasSubstr("schedule.kind: ")) << what;
          continue;
        }
        ASSERT_TRUE(plan.ok()) << what << ": " << plan.status();
        EXPECT_EQ(plan->kind, kind) << what;
        EXPECT_EQ(plan->schedule_name, name) << what;
        EXPECT_EQ(plan->has_backward, schedule::HasBackward(kind)) << what;
        EXPECT_EQ(plan->num_ranks, workers) << what;
        EXPECT_EQ(plan->num_stages, workers * spr) << what;
        EXPECT_EQ(plan->stages_per_rank, spr) << what;
        EXPECT_EQ(plan->transport, "gloo") << what;
        EXPECT_EQ(plan->stages.size(), static_cast<size_t>(workers * spr)) << what;
        auto mapping =
            schedule::StageToRank(workers * spr, workers, schedule::DefaultMappingStyle(kind));
        ASSERT_TRUE(mapping.ok());
        EXPECT_EQ(plan->stage_to_rank, *mapping) << what;
        ASSERT_EQ(plan->lowered.size(), static_cast<size_t>(workers)) << what;
        for (const auto& rank : plan->lowered) {
          for (const auto& action : rank) {
            ASSERT_TRUE(action.has_value()) << what << ": idle slot in a lowered list";
            // Unsharded stages: no UNSHARD/RESHARD.
            EXPECT_NE(action->type, schedule::ActionType::kUnshard) << what;
          }
        }
        schedule::ValidationOptions validation;
        validation.has_backward = schedule::HasBackward(kind);
        EXPECT_TRUE(schedule::ValidateLoweredSchedule(plan->lowered, plan->stage_to_rank,
                                                      plan->num_stages, 8, validation)
                        .ok())
            << what;
      }
    }
  }
}

TEST(PlanJob, StageAndWorkerCountsDefaultFromTheKind) {
  // Workers only: workers x DefaultStagesPerRank stages.
  auto zbv = PlanJob(KindSpec("ZBVZeroBubble", 2, 0, 8));
  ASSERT_TRUE(zbv.ok()) << zbv.status();
  EXPECT_EQ(zbv->num_stages, 4);
  EXPECT_THAT(zbv->stage_to_rank, ElementsAre(0, 1, 1, 0));  // v placement
  // Stages only: stages / DefaultStagesPerRank workers.
  auto interleaved = PlanJob(KindSpec("Interleaved1F1B", 0, 8, 8));
  ASSERT_TRUE(interleaved.ok()) << interleaved.status();
  EXPECT_EQ(interleaved->num_ranks, 4);
  EXPECT_THAT(interleaved->stage_to_rank, ElementsAre(0, 1, 2, 3, 0, 1, 2, 3));
  auto gpipe = PlanJob(KindSpec("GPipe", 0, 3, 8));
  ASSERT_TRUE(gpipe.ok()) << gpipe.status();
  EXPECT_EQ(gpipe->num_ranks, 3);
  // Any number of stages per worker where the kind allows it.
  auto bfs = PlanJob(KindSpec("LoopedBFS", 2, 6, 8));
  ASSERT_TRUE(bfs.ok()) << bfs.status();
  EXPECT_EQ(bfs->stages_per_rank, 3);
  auto too_many = PlanJob(KindSpec("ZBVZeroBubble", 5, 0, 8));  // 10 stages, 8 layers
  EXPECT_THAT(std::string(too_many.status().message()),
              HasSubstr("split.stages: must be <= 8 (the model's layers"));
}

TEST(PlanJob, PlacementStyleMustMatchTheSchedulesLists) {
  spec::JobSpec zbv = KindSpec("ZBVZeroBubble", 2, 4, 8);
  zbv.placement.style = "v";
  EXPECT_TRUE(PlanJob(zbv).ok());
  zbv.placement.style = "loop";
  auto refused = PlanJob(zbv);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status()));
  EXPECT_EQ(refused.status().message(),
            "placement.style: 'loop' places stage 2 on rank 0, but ZBVZeroBubble's action lists "
            "run it on rank 1, which runs stages 1, 2 (v placement); leave placement.style out "
            "or set it to v");

  spec::JobSpec interleaved = KindSpec("Interleaved1F1B", 2, 4, 8);
  interleaved.placement.style = "loop";
  EXPECT_TRUE(PlanJob(interleaved).ok());
  interleaved.placement.style = "v";
  EXPECT_THAT(std::string(PlanJob(interleaved).status().message()),
              HasSubstr("placement.style: 'v' places stage 2 on rank 1, but Interleaved1F1B's "
                        "action lists run it on rank 0"));

  // One stage per worker: loop and v are the same placement.
  for (const char* kind : {"GPipe", "1F1B", "ForwardOnly"}) {
    spec::JobSpec one = KindSpec(kind, 4, 4, 8);
    one.placement.style = "v";
    auto plan = PlanJob(one);
    ASSERT_TRUE(plan.ok()) << kind << ": " << plan.status();
    EXPECT_THAT(plan->stage_to_rank, ElementsAre(0, 1, 2, 3));
  }
}

TEST(PlanJob, DeviceAndTransport) {
  spec::JobSpec spec = KindSpec("1F1B", 2, 2, 4);
  EXPECT_EQ(PlanJob(spec)->transport, "gloo");
  spec.placement.device = "cuda";
  EXPECT_EQ(PlanJob(spec)->transport, "nccl");  // auto
  spec.placement.transport = "gloo";            // host-staged GPU pipelines
  EXPECT_EQ(PlanJob(spec)->transport, "gloo");
  spec.placement.device = "cpu";
  spec.placement.transport = "nccl";
  EXPECT_THAT(std::string(PlanJob(spec).status().message()),
              HasSubstr("placement.transport: nccl needs placement.device cuda"));
}

// ---------------------------------------------------------------------------------------------
// schedule.csv.

std::string Golden(const std::string& file) {
  std::ifstream in(testing::GoldenDir() + "/" + file, std::ios::binary);
  EXPECT_TRUE(in.good()) << file;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A spec that runs `text` (as file `file`) over an MLP of 8 layers.
spec::JobSpec CsvSpec(const std::string& file, const std::string& text, int m,
                      const std::string& format = "compute_only") {
  spec::JobSpec spec = KindSpec("GPipe", 0, 0, m);
  spec.schedule.kind = "";
  spec.schedule.csv = file;
  spec.schedule.csv_text = text;
  spec.schedule.csv_format = format;
  return spec;
}

// `order` without idle slots.
schedule::PipelineOrder WithoutIdle(const schedule::PipelineOrder& order) {
  schedule::PipelineOrder out(order.size());
  for (size_t r = 0; r < order.size(); ++r) {
    for (const auto& action : order[r]) {
      if (action.has_value()) out[r].push_back(action);
    }
  }
  return out;
}

// "<Schedule>_r<ranks>_s<spr>_m<microbatches>.<suffix>".
struct GoldenName {
  std::string schedule;
  int ranks = 0, spr = 0, m = 0;
};
GoldenName ParseGoldenName(const std::string& file) {
  GoldenName name;
  const std::string base = file.substr(0, file.find('.'));
  const size_t r = base.rfind("_r");
  name.schedule = base.substr(0, r);
  EXPECT_EQ(std::sscanf(base.c_str() + r, "_r%d_s%d_m%d", &name.ranks, &name.spr, &name.m), 3)
      << file;
  return name;
}

TEST(PlanJob, PyTorchGoldenCsvPlansToExactlyTheFilesLists) {
  int planned = 0;
  for (const auto& entry : std::filesystem::directory_iterator(testing::GoldenDir())) {
    const std::string file = entry.path().filename().string();
    const bool compute = absl::EndsWith(file, ".compute.csv");
    const bool comms = absl::EndsWith(file, ".comms.csv");
    if (!compute && !comms) continue;
    const GoldenName name = ParseGoldenName(file);
    if (name.schedule == "1F1B") continue;  // PyTorch's defective list: see the next test
    const std::string text = Golden(file);
    auto plan = PlanJob(CsvSpec(file, text, name.m, compute ? "compute_only" : "compute_comms"));
    ASSERT_TRUE(plan.ok()) << file << ": " << plan.status();
    ++planned;
    EXPECT_EQ(plan->schedule_name, "csv:" + file);
    EXPECT_TRUE(plan->has_backward) << file;
    EXPECT_EQ(plan->num_ranks, name.ranks) << file;
    EXPECT_EQ(plan->num_stages, name.ranks * name.spr) << file;
    EXPECT_EQ(plan->stages_per_rank, name.spr) << file;
    // The mapping is the one the file's rows imply: the schedule's own.
    auto kind = schedule::ParseScheduleKind(name.schedule);
    ASSERT_TRUE(kind.ok());
    auto mapping = schedule::StageToRank(name.ranks * name.spr, name.ranks,
                                         schedule::DefaultMappingStyle(*kind));
    EXPECT_EQ(plan->stage_to_rank, *mapping) << file;
    // A generator whose compute order is the file's; with one stage per rank Interleaved1F1B's
    // is 1F1B's.
    if (name.spr > 1) {
      EXPECT_EQ(plan->kind, *kind) << file;
    }
    // Exactly the file's lists: as written (compute_comms), or lowered without UNSHARD/RESHARD.
    auto order = schedule::ParseScheduleCsv(text);
    ASSERT_TRUE(order.ok());
    if (comms) {
      EXPECT_EQ(plan->lowered, WithoutIdle(*order)) << file;
    } else {
      schedule::LoweringOptions lowering;
      lowering.max_active_stages = 0;
      auto lowered = schedule::LowerSchedule(*order, *mapping, plan->num_stages, name.m, lowering);
      ASSERT_TRUE(lowered.ok()) << lowered.status();
      EXPECT_EQ(plan->lowered, *lowered) << file;
    }
    // The same job from schedule.kind plans the same lists (PyTorch's comms lists carry
    // UNSHARD/RESHARD, which ours leave out).
    if (compute) {
      spec::JobSpec generated = KindSpec(name.schedule, name.ranks, name.ranks * name.spr, name.m);
      auto from_kind = PlanJob(generated);
      ASSERT_TRUE(from_kind.ok()) << file << ": " << from_kind.status();
      EXPECT_EQ(from_kind->lowered, plan->lowered) << file;
    }
  }
  EXPECT_GE(planned, 40);
}

TEST(PlanJob, CsvStyleWorkersAndKind) {
  const std::string text = Golden("Interleaved1F1B_r2_s2_m4.compute.csv");
  spec::JobSpec spec = CsvSpec("mine.csv", text, 4);
  spec.placement.workers = 2;
  spec.split.stages = 4;
  spec.placement.style = "loop";
  auto plan = PlanJob(spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->kind, schedule::ScheduleKind::kInterleaved1F1B);
  spec.placement.style = "v";
  EXPECT_EQ(PlanJob(spec).status().message(),
            "placement.style: 'v' places stage 2 on rank 1, but the rows of 'mine.csv' run it on "
            "rank 0 (line 1), which runs stages 0, 2 (loop placement); leave placement.style out "
            "or set it to loop");
  // A ZBV file in v placement.
  spec::JobSpec zbv = CsvSpec("zbv.csv", Golden("ZBVZeroBubble_r2_s2_m4.compute.csv"), 4);
  zbv.placement.style = "v";
  auto zbv_plan = PlanJob(zbv);
  ASSERT_TRUE(zbv_plan.ok()) << zbv_plan.status();
  EXPECT_THAT(zbv_plan->stage_to_rank, ElementsAre(0, 1, 1, 0));
  EXPECT_EQ(zbv_plan->kind, schedule::ScheduleKind::kZBVZeroBubble);

  // A hand-written file matching no generator, forward-only, ranks with different stage counts.
  auto forward = PlanJob(CsvSpec("fwd.csv", "0F0,1F0,0F1,1F1\n2F0,2F1\n", 2));
  ASSERT_TRUE(forward.ok()) << forward.status();
  EXPECT_FALSE(forward->has_backward);
  EXPECT_EQ(forward->kind, schedule::ScheduleKind::kForwardOnly);
  EXPECT_THAT(forward->stage_to_rank, ElementsAre(0, 0, 1));
  EXPECT_EQ(forward->stages_per_rank, 2);
  EXPECT_EQ(forward->schedule_name, "csv:fwd.csv");

  // A CUDA job from a file.
  spec::JobSpec cuda = CsvSpec("mine.csv", text, 4);
  cuda.placement.device = "cuda";
  EXPECT_EQ(PlanJob(cuda)->transport, "nccl");
}

// Each bad file is refused with INVALID_ARGUMENT naming the spec field, the file and, where one
// action or rank is at fault, its line (and column).
TEST(PlanJob, BrokenCsvIsRefusedNamingFileLineAndColumn) {
  struct Bad {
    std::string name;
    spec::JobSpec spec;
    std::string want;
  };
  const std::string gpipe = Golden("GPipe_r2_s1_m4.compute.csv");
  std::string no_backward = gpipe;  // rank 1 without 1B3
  no_backward.replace(no_backward.find(",1B3"), 4, "");
  std::string interleaved = Golden("Interleaved1F1B_r2_s2_m4.compute.csv");
  interleaved.replace(interleaved.find("3B3,"), 4, ",");  // stage 3 without its last backward
  spec::JobSpec rows = CsvSpec("bad.csv", gpipe, 4);
  rows.placement.workers = 3;
  spec::JobSpec fewer_rows = CsvSpec("bad.csv", Golden("GPipe_r4_s1_m4.compute.csv"), 4);
  fewer_rows.placement.workers = 2;
  spec::JobSpec stages = CsvSpec("bad.csv", gpipe, 4);
  stages.split.stages = 3;
  spec::JobSpec not_sent = CsvSpec("bad.csv", "", 4);
  // Rank 0 waits for 0B0 before it sends F1; rank 1 needs F1 before it sends B0.
  const std::string deadlock =
      "0F0,0SEND_F0,0RECV_B0,0B0,0F1,0SEND_F1,0RECV_B1,0B1\n"
      "1RECV_F0,1RECV_F1,1F0,1F1,1B0,1SEND_B0,1B1,1SEND_B1\n";
  const std::vector<Bad> bad = {
      {"unknown action", CsvSpec("bad.csv", "0F0,0F1\n1F0,1X1\n", 2),
       "schedule.csv: bad.csv line 2 (rank 1), column 2 (step 1): "},
      {"missing backward", CsvSpec("bad.csv", no_backward, 4),
       "schedule.csv: bad.csv line 2 (rank 1), column 8 (step 7): 1REDUCE_GRAD runs before the "
       "last backward of stage 1"},
      {"missing backward, no REDUCE_GRAD", CsvSpec("bad.csv", interleaved, 4),
       "schedule.csv: bad.csv line 2 (rank 1)"},
      {"deadlock", CsvSpec("bad.csv", deadlock, 2, "compute_comms"),
       "schedule.csv: bad.csv line 1 (rank 0), column 4 (step 3): "},
      {"comms in compute_only", CsvSpec("bad.csv", deadlock, 2),
       "schedule.csv: bad.csv line 1 (rank 0), column 2 (step 1): 0SEND_F0 is a SEND_F action"},
      {"fewer rows than workers", rows,
       "schedule.csv: bad.csv: the file has 2 rows (one per rank), but placement.workers is 3"},
      {"more rows than workers", fewer_rows,
       "schedule.csv: bad.csv line 3 (rank 2): the file has 4 rows (one per rank), but "
       "placement.workers is 2"},
      {"PyTorch's 1F1B", CsvSpec("1f1b.csv", Golden("1F1B_r2_s1_m4.compute.csv"), 4),
       "schedule.csv: 1f1b.csv line 2 (rank 1), column 2 (step 1): Running Full Backward for "
       "stage 1, microbatch 0 without first running Forward"},
      {"too few microbatches", CsvSpec("bad.csv", gpipe, 8),
       "schedule.microbatches: 'bad.csv' schedules 4 microbatches (0..3), but "
       "schedule.microbatches is 8"},
      {"microbatch out of range", CsvSpec("bad.csv", gpipe, 3), "schedule.csv: bad.csv line 1"},
      {"stages", stages, "split.stages: 'bad.csv' runs 2 stages (0..1), but split.stages is 3"},
      {"not sent", not_sent, "schedule.csv: the contents of 'bad.csv' were not sent with the spec"},
      {"stage past the model's layers", CsvSpec("bad.csv", "0F0,1F0\n,2F0,1000F0\n", 1),
       "schedule.csv: bad.csv line 2 (rank 1), column 3 (step 2): 1000F0 runs stage 1000, "
       "but the model has 8 layers"},
      {"stage past the file limits", CsvSpec("bad.csv", "0F0,1F0\n,2F0,1000000F0\n", 1),
       "schedule.csv: bad.csv line 2 (rank 1), column 3 (step 2): 1000000F0 names stage "
       "1000000; stage indices must be below 4096"},
      {"empty rank", CsvSpec("bad.csv", "0F0,1F0\n\n", 1, "compute_only"),
       "schedule.csv: bad.csv line 2 (rank 1): the rank runs no stage"},
  };
  for (const Bad& b : bad) {
    auto plan = PlanJob(b.spec);
    ASSERT_FALSE(plan.ok()) << b.name;
    EXPECT_TRUE(absl::IsInvalidArgument(plan.status())) << b.name << ": " << plan.status();
    EXPECT_THAT(std::string(plan.status().message()), HasSubstr(b.want)) << b.name;
  }
}

}  // namespace
}  // namespace stagecoach::coordinator::planner_test

namespace stagecoach::coordinator::planner_test {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Layers named `names` with parameters 10, 20, ... and no times.
std::vector<v1::LayerInfo> Layers(const std::vector<std::string>& names) {
  std::vector<v1::LayerInfo> out;
  for (size_t i = 0; i < names.size(); ++i) {
    v1::LayerInfo& layer = out.emplace_back();
    layer.set_name(names[i]);
    layer.set_parameters(10 * static_cast<int64_t>(i + 1));
  }
  return out;
}

// A TorchScript model's spec with `split` and `extra` sections.
spec::JobSpec TorchScriptSpec(const std::string& split, const std::string& extra = "") {
  auto spec = spec::ParseJobSpec(
      absl::StrCat("name: t\nmodel: {torchscript: net.pt}\nsplit: ", split,
                   "\nschedule: {kind: GPipe, microbatches: 4}\ntraining: {batch_size: 8}\n"
                   "data: {kind: tensors, path: /data/x.pt}\n",
                   extra),
      "t");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

std::vector<std::pair<int, int>> Ranges(const Plan& plan) {
  std::vector<std::pair<int, int>> out;
  for (const StagePlan& s : plan.stages) out.emplace_back(s.first_layer, s.end_layer);
  return out;
}

TEST(BuiltinLayers, NamesAndParametersOfTheSpec) {
  spec::BuiltinModel gpt;
  gpt.family = "gpt";
  gpt.vocab = 64;
  gpt.d_model = 8;
  gpt.layers = 2;
  gpt.heads = 2;
  gpt.seq = 4;
  const std::vector<v1::LayerInfo> layers = BuiltinLayers(gpt);
  std::vector<std::string> names;
  for (const auto& layer : layers) names.push_back(layer.name());
  EXPECT_THAT(names, ElementsAre("embed", "blocks.0", "blocks.1", "norm", "head"));
  EXPECT_EQ(layers[0].parameters(), 64 * 8 + 4 * 8);
  EXPECT_EQ(layers[4].parameters(), 8 * 64);
  EXPECT_EQ(layers[1].forward_seconds(), 0.0);
}

TEST(PlanJob, SplitPointsCutBeforeBeginningAndAfterEnd) {
  // Four MLP layers "0".."3": "1: end" and "3: beginning" give 0 1 | 2 | 3.
  auto plan = PlanJob(Parse("", "[4, 8, 8, 8, 2]", "{points: {\"1\": end, \"3\": beginning}}"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->num_stages, 3);
  EXPECT_EQ(plan->num_ranks, 3);  // GPipe: one stage per worker
  EXPECT_THAT(Ranges(*plan), ElementsAre(std::pair(0, 2), std::pair(2, 3), std::pair(3, 4)));
  // Layer i has 8*8+8 = 72 parameters (4*8+8 = 40 for the first, 8*2+2 = 18 for the last).
  EXPECT_EQ(plan->stages[0].parameters, 40 + 72);
  EXPECT_EQ(plan->stages[2].parameters, 18);
  ASSERT_EQ(plan->layers.size(), 4u);
  EXPECT_EQ(plan->layers[3].name(), "3");
}

TEST(PlanJob, SplitPointsOfATorchScriptModel) {
  auto plan = PlanJob(TorchScriptSpec("{points: {\"blocks.1\": beginning}}"),
                      Layers({"embed", "blocks.0", "blocks.1", "head"}));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(Ranges(*plan), ElementsAre(std::pair(0, 2), std::pair(2, 4)));
  EXPECT_EQ(plan->stages[0].parameters, 10 + 20);
  EXPECT_EQ(plan->stages[1].parameters, 30 + 40);
  EXPECT_EQ(plan->layers[0].name(), "embed");
}

// A point at a module whose calls the worker opened stands for its first or its last layer.
TEST(PlanJob, SplitPointsAtAModuleThatHoldsLayers) {
  const std::vector<v1::LayerInfo> layers =
      Layers({"conv_proj", "encoder.layers.b0", "encoder.layers.b1", "encoder.layers.b2",
              "encoder.ln", "heads"});
  struct Case {
    std::string points;
    std::vector<std::pair<int, int>> ranges;
  };
  for (const Case& c : std::vector<Case>{
           {"{encoder.layers.b1: beginning}", {{0, 2}, {2, 6}}},
           {"{encoder.layers: beginning}", {{0, 1}, {1, 6}}},
           {"{encoder.layers: end}", {{0, 4}, {4, 6}}},
           {"{encoder: end, encoder.layers.b2: beginning}", {{0, 3}, {3, 5}, {5, 6}}},
       }) {
    SCOPED_TRACE(c.points);
    auto plan = PlanJob(TorchScriptSpec(absl::StrCat("{points: ", c.points, "}")), layers);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(Ranges(*plan), c.ranges);
  }
  auto split = PlanJob(TorchScriptSpec("{points: {a: end}}"), Layers({"a.x", "b", "a.y", "c"}));
  ASSERT_FALSE(split.ok());
  EXPECT_THAT(std::string(split.status().message()),
              HasSubstr("split.points.a: the layers inside 'a' are not contiguous (layer b comes "
                        "between a.x and a.y)"));
  auto outside = PlanJob(TorchScriptSpec("{points: {encode: end}}"), layers);
  ASSERT_FALSE(outside.ok());
  EXPECT_THAT(std::string(outside.status().message()),
              HasSubstr("'encode' is not a layer of the model"));
}

TEST(PlanJob, SplitPointErrorsNameThePoints) {
  const std::vector<v1::LayerInfo> layers = Layers({"embed", "blocks.0", "blocks.1", "head"});
  struct Case {
    std::string points, want;
  };
  for (const Case& c : std::vector<Case>{
           {"{\"blocks.7\": beginning}",
            "split.points.blocks.7: 'blocks.7' is not a layer of the model (its 4 layers: embed, "
            "blocks.0, blocks.1, head)"},
           {"{embed: beginning}",
            "split.points.embed: 'beginning' of the first layer (embed) would leave stage 0 "
            "without layers"},
           {"{head: end}",
            "split.points.head: 'end' of the last layer (head) would leave the last stage "
            "without layers"},
           {"{\"blocks.0\": end, \"blocks.1\": beginning}",
            "split.points: 'blocks.0: end' and 'blocks.1: beginning' both cut between layers "
            "blocks.0 and blocks.1"},
       }) {
    auto plan = PlanJob(TorchScriptSpec(absl::StrCat("{points: ", c.points, "}")), layers);
    ASSERT_FALSE(plan.ok()) << c.points;
    EXPECT_TRUE(absl::IsInvalidArgument(plan.status()));
    EXPECT_THAT(std::string(plan.status().message()), HasSubstr(c.want));
  }
}

TEST(PlanJob, SplitPointsMustAgreeWithStagesAndWorkers) {
  const std::vector<v1::LayerInfo> layers = Layers({"a", "b", "c", "d"});
  // Two stages on three workers.
  auto refused = PlanJob(TorchScriptSpec("{points: {b: end}}", "placement: {workers: 3}"), layers);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("placement.workers: 2 stages do not divide evenly among 3 workers (the "
                        "stages split.points make must be a multiple of placement.workers)"));
  // Two stages on one worker: Interleaved1F1B runs both there.
  spec::JobSpec interleaved = TorchScriptSpec("{points: {b: end}}", "placement: {workers: 1}");
  interleaved.schedule.kind = "Interleaved1F1B";
  auto plan = PlanJob(interleaved, layers);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->num_ranks, 1);
  EXPECT_THAT(Ranges(*plan), ElementsAre(std::pair(0, 2), std::pair(2, 4)));
  // split.stages and split.points together (the parser keeps them apart; the planner checks
  // a spec built otherwise too).
  spec::JobSpec both = TorchScriptSpec("{points: {b: end}}");
  both.split.stages = 3;
  auto mismatch = PlanJob(both, layers);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_THAT(std::string(mismatch.status().message()),
              HasSubstr("split.stages: split.points make 2 stages (starting at layers a, c), but "
                        "split.stages is 3"));
  both.split.stages = 2;
  EXPECT_TRUE(PlanJob(both, layers).ok());
}

TEST(PlanJob, TorchScriptModelsNeedTheirLayersAndFittingData) {
  // The layers come from a worker; planning from the spec alone is refused.
  auto alone = PlanJob(TorchScriptSpec("{stages: 2}"));
  ASSERT_FALSE(alone.ok());
  EXPECT_THAT(std::string(alone.status().message()), HasSubstr("model.torchscript: "));
  EXPECT_TRUE(NeedsInspection(TorchScriptSpec("{stages: 2}")));
  EXPECT_FALSE(NeedsProfile(TorchScriptSpec("{stages: 2}")));
  EXPECT_FALSE(NeedsInspection(Parse("")));

  auto plan = PlanJob(TorchScriptSpec("{stages: 2, policy: equal-params}"),
                      Layers({"a", "b", "c", "d"}));  // 10 20 30 40: a b c | d
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(Ranges(*plan), ElementsAre(std::pair(0, 3), std::pair(3, 4)));
  EXPECT_EQ(plan->stages[0].parameters, 60);

  // More stages than layers.
  auto too_many = PlanJob(TorchScriptSpec("{stages: 3}"), Layers({"a", "b"}));
  ASSERT_FALSE(too_many.ok());
  EXPECT_THAT(std::string(too_many.status().message()), HasSubstr("split.stages: must be <= 2"));
  EXPECT_THAT(std::string(PlanJob(TorchScriptSpec("{stages: 1}"), {}).status().message()),
              HasSubstr("model.torchscript: the model has no layers"));

  // Synthetic data is drawn for a built-in model's sizes; a tensors file carries its shapes, a
  // tokens file needs data.seq.
  spec::JobSpec synthetic = TorchScriptSpec("{stages: 2}");
  synthetic.data.kind = "synthetic";
  synthetic.data.path.clear();
  EXPECT_THAT(std::string(PlanJob(synthetic, Layers({"a", "b"})).status().message()),
              HasSubstr("data.kind: 'synthetic' data is drawn for a built-in model's sizes and "
                        "cannot feed a TorchScript model (use data.kind tensors or tokens)"));
  spec::JobSpec tokens = TorchScriptSpec("{stages: 2}");
  tokens.data.kind = "tokens";
  EXPECT_THAT(std::string(PlanJob(tokens, Layers({"a", "b"})).status().message()),
              HasSubstr("data.seq: required for data.kind tokens with a TorchScript model"));
  tokens.data.seq = 16;
  EXPECT_TRUE(PlanJob(tokens, Layers({"a", "b"})).ok());
}

TEST(PlanJob, ProfiledBalancesMeasuredTimes) {
  spec::JobSpec spec = TorchScriptSpec("{stages: 2, policy: profiled}");
  EXPECT_TRUE(NeedsProfile(spec));
  // Parameters favour a b c | d; the times (forward + backward) favour a | b c d.
  std::vector<v1::LayerInfo> layers = Layers({"a", "b", "c", "d"});
  const double forward[] = {0.006, 0.001, 0.001, 0.001};
  for (size_t i = 0; i < layers.size(); ++i) {
    layers[i].set_forward_seconds(forward[i]);
    layers[i].set_backward_seconds(2 * forward[i]);
  }
  auto plan = PlanJob(spec, layers);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(Ranges(*plan), ElementsAre(std::pair(0, 1), std::pair(1, 4)));
  EXPECT_DOUBLE_EQ(plan->layers[0].forward_seconds(), 0.006);

  // Without times, profiled cannot plan.
  auto unmeasured = PlanJob(spec, Layers({"a", "b", "c", "d"}));
  ASSERT_FALSE(unmeasured.ok());
  EXPECT_THAT(std::string(unmeasured.status().message()),
              HasSubstr("split.policy: 'profiled' needs each layer's measured forward and "
                        "backward time"));

  // A built-in model profiled the same way: times, not parameter counts, decide.
  spec::JobSpec mlp = Parse("", "[4, 8, 8, 8, 2]", "{stages: 2, policy: profiled}");
  EXPECT_TRUE(NeedsInspection(mlp));
  std::vector<v1::LayerInfo> mlp_layers = BuiltinLayers(*mlp.model.builtin);
  for (size_t i = 0; i < mlp_layers.size(); ++i) {
    mlp_layers[i].set_forward_seconds(i == 3 ? 0.01 : 0.001);
  }
  auto mlp_plan = PlanJob(mlp, mlp_layers);
  ASSERT_TRUE(mlp_plan.ok()) << mlp_plan.status();
  EXPECT_THAT(Ranges(*mlp_plan), ElementsAre(std::pair(0, 3), std::pair(3, 4)));
  // Split points take precedence over the policy: no profile needed.
  mlp.split.points = {{"0", "end"}};
  mlp.split.stages = 0;
  EXPECT_FALSE(NeedsInspection(mlp));
}

}  // namespace
}  // namespace stagecoach::coordinator::planner_test
