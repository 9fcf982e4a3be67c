// The measured step trace: ranks' reports on one time base, SEND/RECV pairs as transfers, errors;
// the per-job store (capacity, latest complete step, restarts); and, against the simulator, that
// a trace of simulated timings reproduces the simulated times with every transfer arriving after
// its SEND and before its consumer runs, whatever each rank's own time base.
#include "coordinator/jobs/step_trace.h"

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/schedule/action.h"
#include "common/schedule/simulator.h"
#include "common/spec/spec_parser.h"
#include "coordinator/planning/planner.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace stagecoach::coordinator::step_trace_test {
namespace {

using nlohmann::json;

const absl::Time kT0 = absl::FromUnixSeconds(1700000000);

v1::ActionTiming Timing(int64_t start_us, int64_t end_us, int64_t wait_us = 0) {
  v1::ActionTiming t;
  t.set_start_us(start_us);
  t.set_end_us(end_us);
  t.set_wait_us(wait_us);
  return t;
}

RankStepTiming Rank(int rank, absl::Time start,
                    const std::vector<std::tuple<std::string, int64_t, int64_t, int64_t>>& rows) {
  RankStepTiming out;
  out.rank = rank;
  out.start = start;
  for (const auto& [action, s, e, w] : rows) {
    out.actions.push_back(action);
    out.timings.push_back(Timing(s, e, w));
  }
  return out;
}

// Rank 0 starts at kT0, rank 1 1 ms later; times below are relative to each rank's start.
std::vector<RankStepTiming> TwoRanks() {
  return {
      // Listed out of rank order on purpose.
      Rank(1, kT0 + absl::Microseconds(1000),
           {{"1RECV_F0", 0, 5, 0},      // abs 1000..1005
            {"1F0", 5, 300, 0},         // abs 1005..1300
            {"1B0", 300, 500, 0},       // abs 1300..1500
            {"1SEND_B0", 500, 510, 0},  // abs 1500..1510
            {"1REDUCE_GRAD", 510, 520, 0}}),
      Rank(0, kT0,
           {{"0F0", 0, 100, 0},
            {"0SEND_F0", 100, 110, 0},
            {"0RECV_B0", 110, 111, 0},
            {"0B0", 111, 2000, 1500},  // waited 1500 us for the gradient: it arrived at 1611
            {"0REDUCE_GRAD", 2000, 2010, 0}}),
  };
}

json Parse(const std::string& text) {
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(doc.is_discarded()) << text;
  return doc;
}

// Events of `doc` with phase `ph` (and, when given, name and pid).
std::vector<json> Events(const json& doc, const std::string& ph, const std::string& name = "",
                         int pid = -1) {
  std::vector<json> out;
  for (const json& e : doc.at("traceEvents")) {
    if (e.at("ph") != ph) continue;
    if (!name.empty() && e.at("name") != name) continue;
    if (pid >= 0 && e.at("pid") != pid) continue;
    out.push_back(e);
  }
  return out;
}

// The one transfer event named `name` on `pid`.
json Transfer(const json& doc, const std::string& name, int pid) {
  for (const json& e : Events(doc, "X", name, pid)) {
    if (e.at("args").value("event", "") == "transfer") return e;
  }
  ADD_FAILURE() << "no transfer event " << name << " on rank " << pid;
  return json::object();
}

TEST(MeasuredStepTrace, PutsRanksOnOneTimeBaseAndPairsSendsWithRecvs) {
  auto trace = MeasuredStepTrace(TwoRanks(), "job-1 step 7");
  ASSERT_TRUE(trace.ok()) << trace.status();
  const json doc = Parse(*trace);
  EXPECT_EQ(doc.at("otherData").at("title"), "job-1 step 7");
  EXPECT_EQ(doc.at("otherData").at("num_ranks"), 2);

  // Compute events per rank: F, B and REDUCE_GRAD (SEND/RECV are not compute events).
  int compute[2] = {0, 0};
  for (const json& e : Events(doc, "X")) {
    if (e.at("tid") == 0) ++compute[e.at("pid").get<int>()];
  }
  EXPECT_EQ(compute[0], 3);
  EXPECT_EQ(compute[1], 3);

  // Rank 0 started first: its times are its own; rank 1's are shifted by 1 ms.
  const auto f0 = Events(doc, "X", "0F0", 0);
  ASSERT_EQ(f0.size(), 1u);
  EXPECT_EQ(f0[0].at("ts").get<double>(), 0);
  EXPECT_EQ(f0[0].at("dur").get<double>(), 100);
  const auto f1 = Events(doc, "X", "1F0", 1);
  ASSERT_EQ(f1.size(), 1u);
  EXPECT_EQ(f1[0].at("ts").get<double>(), 1005);
  EXPECT_EQ(f1[0].at("dur").get<double>(), 295);
  const auto b1 = Events(doc, "X", "1B0", 1);
  ASSERT_EQ(b1.size(), 1u);
  EXPECT_EQ(b1[0].at("ts").get<double>(), 1300);

  // Posts as instants at the action's start, on the rank's timeline.
  const auto recv_post = Events(doc, "i", "1RECV_F0", 1);
  ASSERT_EQ(recv_post.size(), 1u);
  EXPECT_EQ(recv_post[0].at("ts").get<double>(), 1000);

  // Activation: sent at 100, the receive (posted at 1000) ended at 1005.
  const json fwd_send = Transfer(doc, "0SEND_F0", 0);
  EXPECT_EQ(fwd_send.at("ts").get<double>(), 100);
  EXPECT_EQ(fwd_send.at("dur").get<double>(), 905);
  EXPECT_EQ(fwd_send.at("args").at("peer_rank"), 1);
  const json fwd_recv = Transfer(doc, "1RECV_F0", 1);
  EXPECT_EQ(fwd_recv.at("ts").get<double>(), 100);
  EXPECT_EQ(fwd_recv.at("args").at("peer_rank"), 0);
  // Gradient: sent at 1500; rank 0's receive was posted at 110, long before, but 0B0 waited
  // until 111 + 1500 = 1611 for it.
  const json bwd_send = Transfer(doc, "1SEND_B0", 1);
  EXPECT_EQ(bwd_send.at("ts").get<double>(), 1500);
  EXPECT_EQ(bwd_send.at("dur").get<double>(), 111);
  const json bwd_recv = Transfer(doc, "0RECV_B0", 0);
  EXPECT_EQ(bwd_recv.at("ts").get<double>(), 1500);

  // One flow arrow per transfer.
  const auto flows = Events(doc, "s");
  ASSERT_EQ(flows.size(), 2u);
  EXPECT_EQ(Events(doc, "s", "0SEND_F0 -> 1RECV_F0").size(), 1u);
  EXPECT_EQ(Events(doc, "s", "1SEND_B0 -> 0RECV_B0").size(), 1u);
}

TEST(MeasuredStepTrace, TheBaseIsTheEarliestRankWhicheverItIs) {
  std::vector<RankStepTiming> ranks = TwoRanks();
  ranks[1].start = kT0 + absl::Microseconds(3000);  // rank 0 now starts 2 ms after rank 1
  auto trace = MeasuredStepTrace(ranks, "");
  ASSERT_TRUE(trace.ok()) << trace.status();
  const json doc = Parse(*trace);
  EXPECT_FALSE(doc.at("otherData").contains("title"));
  EXPECT_EQ(Events(doc, "X", "1F0", 1).at(0).at("ts").get<double>(), 5);
  EXPECT_EQ(Events(doc, "X", "0F0", 0).at(0).at("ts").get<double>(), 2000);
}

TEST(MeasuredStepTrace, ReplicasPairTransfersWithinTheirReplicaAndDrawTheirReduction) {
  // Two replicas of the same 2-rank step: tasks 0, 1 (replica 0) and 2, 3 (replica 1).
  std::vector<RankStepTiming> ranks;
  for (int replica = 0; replica < 2; ++replica) {
    for (RankStepTiming r : TwoRanks()) {
      const int rank = r.rank;
      r.rank = replica * 2 + rank;
      r.replica = replica;
      r.label = absl::StrCat("Replica ", replica, " rank ", rank);
      r.start += absl::Microseconds(replica * 50);
      v1::ReductionBucket bucket;
      bucket.set_stage(rank);
      bucket.set_bytes(4096);
      bucket.mutable_start()->set_nanos(100000);  // 100 us
      bucket.mutable_end()->set_nanos(900000);    // 900 us
      r.reduction.push_back(bucket);
      ranks.push_back(std::move(r));
    }
  }
  auto trace = MeasuredStepTrace(ranks, "replicas");
  ASSERT_TRUE(trace.ok()) << trace.status();
  const json doc = Parse(*trace);
  // Each replica's SEND_F0 -> RECV_F0 and SEND_B0 -> RECV_B0: 4 flows, none across replicas.
  const std::vector<json> starts = Events(doc, "s");
  ASSERT_EQ(starts.size(), 4u);
  for (const json& e : Events(doc, "f")) {
    const int pid = e.at("pid").get<int>();
    bool same_replica = false;
    for (const json& s : starts) {
      if (s.at("id") == e.at("id")) same_replica = s.at("pid").get<int>() / 2 == pid / 2;
    }
    EXPECT_TRUE(same_replica) << e.dump();
  }
  // One reduction span per task on its own track, and the processes named by replica and rank.
  const std::vector<json> spans = Events(doc, "X", "reduce stage 1", 3);
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(spans[0].at("cat"), "collective");
  EXPECT_EQ(spans[0].at("args").at("bytes"), 4096);
  EXPECT_EQ(spans[0].at("tid"), 1000);
  bool named = false;
  for (const json& m : Events(doc, "M", "process_name", 3)) {
    named = named || m.at("args").at("name") == "Replica 1 rank 1";
  }
  EXPECT_TRUE(named);
}

// Sharded parameters: each all-gather on a "parameter gathering" track of its own, beside the
// gradient reduction's.
TEST(MeasuredStepTrace, ParameterGathersHaveATrackOfTheirOwn) {
  std::vector<RankStepTiming> ranks = TwoRanks();
  for (RankStepTiming& r : ranks) {
    v1::ReductionBucket bucket;
    bucket.set_stage(r.rank);
    bucket.set_bytes(4096);
    bucket.mutable_start()->set_nanos(500000);
    bucket.mutable_end()->set_nanos(900000);
    r.reduction.push_back(bucket);
    v1::ReductionBucket gather = bucket;
    gather.set_bytes(8192);
    gather.mutable_start()->set_nanos(0);
    gather.mutable_end()->set_nanos(200000);
    r.gathers.push_back(gather);
  }
  auto trace = MeasuredStepTrace(ranks, "sharded");
  ASSERT_TRUE(trace.ok()) << trace.status();
  const json doc = Parse(*trace);
  const std::vector<json> gathers = Events(doc, "X", "gather stage 1", 1);
  ASSERT_EQ(gathers.size(), 1u);
  EXPECT_EQ(gathers[0].at("args").at("bytes"), 8192);
  EXPECT_EQ(gathers[0].at("tid"), 1001);
  EXPECT_EQ(Events(doc, "X", "reduce stage 1", 1).at(0).at("tid"), 1000);
  std::set<std::string> tracks;
  for (const json& m : Events(doc, "M", "thread_name", 1)) {
    tracks.insert(m.at("args").at("name").get<std::string>());
  }
  EXPECT_TRUE(tracks.count("parameter gathering") && tracks.count("gradient reduction"));
}

TEST(MeasuredStepTrace, UnmatchedSendsAndRecvsGetNoTransfer) {
  // Only rank 0 reported: its SEND_F and RECV_B have no partner.
  auto trace = MeasuredStepTrace({TwoRanks()[1]}, "partial");
  ASSERT_TRUE(trace.ok()) << trace.status();
  const json doc = Parse(*trace);
  EXPECT_TRUE(Events(doc, "s").empty());
  for (const json& e : Events(doc, "X")) {
    EXPECT_NE(e.at("args").value("event", ""), "transfer") << e.dump();
  }
  EXPECT_EQ(Events(doc, "i", "0SEND_F0", 0).size(), 1u);
  EXPECT_EQ(Events(doc, "X", "0B0", 0).size(), 1u);
}

TEST(MeasuredStepTrace, RefusesInconsistentReports) {
  std::vector<RankStepTiming> ranks = TwoRanks();
  ranks[0].timings.pop_back();
  auto trace = MeasuredStepTrace(ranks, "");
  EXPECT_EQ(trace.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(trace.status().message(), "rank 1 reports 5 actions but 4"))
      << trace.status();

  ranks = TwoRanks();
  ranks[1].actions[3] = "0B";
  trace = MeasuredStepTrace(ranks, "");
  EXPECT_EQ(trace.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(trace.status().message(), "rank 0, action 3")) << trace.status();

  ranks = TwoRanks();
  ranks[0].rank = 0;
  trace = MeasuredStepTrace(ranks, "");
  EXPECT_EQ(trace.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(trace.status().message(), "rank 0 is listed twice"))
      << trace.status();

  ranks = TwoRanks();
  ranks[0].timings[1].set_end_us(1);
  trace = MeasuredStepTrace(ranks, "");
  EXPECT_EQ(trace.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(trace.status().message(), "1F0")) << trace.status();
}

TEST(StepTraceStore, KeepsTheLatestStepsAndTracesTheLatestCompleteOne) {
  StepTraceStore store(3);
  EXPECT_EQ(store.first_kept(), -1);
  EXPECT_EQ(store.last_kept(), -1);
  int64_t traced = -7;
  auto empty = store.Trace(-1, 2, "", &traced);
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(empty.status().message(), "no steps are kept"));

  for (int step = 0; step < 5; ++step) {
    for (const RankStepTiming& r : TwoRanks()) store.Add(step, r);
  }
  EXPECT_EQ(store.first_kept(), 2);
  EXPECT_EQ(store.last_kept(), 4);
  // Step 5 has only rank 1's report so far: the latest complete step is still 4.
  store.Add(5, TwoRanks()[0]);
  EXPECT_EQ(store.first_kept(), 3);
  EXPECT_EQ(store.last_kept(), 5);
  auto latest = store.Trace(-1, 2, "latest", &traced);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(traced, 4);
  EXPECT_EQ(*latest, *MeasuredStepTrace(TwoRanks(), "latest", "step-4"));

  auto incomplete = store.Trace(5, 2, "", &traced);
  EXPECT_EQ(incomplete.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(
      absl::StrContains(incomplete.status().message(), "step 5 lacks the reports of ranks 0"))
      << incomplete.status();
  auto evicted = store.Trace(1, 2, "", &traced);
  EXPECT_EQ(evicted.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(
      absl::StrContains(evicted.status().message(), "step 1 is not kept (steps 3..5 are kept)"))
      << evicted.status();
  // A step older than every kept one is not taken when the store is full.
  store.Add(0, TwoRanks()[0]);
  EXPECT_EQ(store.first_kept(), 3);

  auto explicit_step = store.Trace(3, 2, "", &traced, "job-9");
  ASSERT_TRUE(explicit_step.ok()) << explicit_step.status();
  EXPECT_EQ(traced, 3);
  // One id on every event of the step, whichever rank's: the step lines up across ranks.
  const nlohmann::json trace = nlohmann::json::parse(*explicit_step);
  EXPECT_EQ(trace["otherData"]["step_id"], "job-9/step-3");
  int tagged = 0;
  for (const nlohmann::json& e : trace["traceEvents"]) {
    if (e["ph"] == "M") continue;
    EXPECT_EQ(e["args"]["step_id"], "job-9/step-3") << e.dump();
    ++tagged;
  }
  EXPECT_GT(tagged, 4);

  // Copies are independent; a restart from step 3 forgets 4 and 5.
  StepTraceStore copy = store;
  store.DropAfter(3);
  EXPECT_EQ(store.last_kept(), 3);
  EXPECT_EQ(copy.last_kept(), 5);
  ASSERT_TRUE(store.Trace(-1, 2, "", &traced).ok());
  EXPECT_EQ(traced, 3);
  // After the restart the step runs again and its new reports replace nothing old.
  for (const RankStepTiming& r : TwoRanks()) store.Add(4, r);
  ASSERT_TRUE(store.Trace(-1, 2, "", nullptr).ok());
  EXPECT_EQ(store.last_kept(), 4);
}

// Simulated timings of a real 1F1B plan, reported as the workers would: each rank's times
// relative to its own first action, with its own wall-clock start. One simulator unit is 1 ms.
TEST(MeasuredStepTrace, SimulatedOneFOneBStepKeepsCausality) {
  auto spec = spec::ParseJobSpec(
      "name: t\nmodel: {builtin: {family: mlp, sizes: [4, 8, 8, 8, 2]}}\nsplit: {stages: 4}\n"
      "schedule: {kind: 1F1B, microbatches: 8}\ntraining: {batch_size: 16}\n",
      "t");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto plan = PlanJob(*spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->num_ranks, 4);
  schedule::CostModel costs;
  costs.per_stage = {{1, 2, 1, 1}, {1.5, 3, 1, 1}, {1, 2, 1, 1}, {2, 4, 1, 1}};
  costs.latency = 0.25;
  costs.reduce_grad = 0.5;
  auto sim = schedule::Simulate(plan->lowered, plan->stage_to_rank, plan->num_stages,
                                plan->num_microbatches, costs);
  ASSERT_TRUE(sim.ok()) << sim.status();
  ASSERT_FALSE(sim->messages.empty());

  const auto us = [](double units) { return static_cast<int64_t>(std::llround(units * 1000)); };
  std::vector<RankStepTiming> ranks;
  for (int r = 0; r < plan->num_ranks; ++r) {
    const auto& timeline = sim->timeline[r];
    ASSERT_FALSE(timeline.empty());
    const double first = timeline.front().start;
    RankStepTiming rank;
    rank.rank = r;
    rank.start = kT0 + absl::Microseconds(us(first));
    for (const schedule::TimedAction& t : timeline) {
      rank.actions.push_back(t.action.ToString());
      rank.timings.push_back(Timing(us(t.start - first), us(t.end - first)));
    }
    ranks.push_back(std::move(rank));
  }
  auto trace = MeasuredStepTrace(ranks, "simulated");
  ASSERT_TRUE(trace.ok()) << trace.status();
  const json doc = Parse(*trace);

  // Every simulated action is where the simulator put it, whatever each rank's base was.
  std::map<std::tuple<int, std::string>, double> starts;
  for (const json& e : Events(doc, "X")) {
    if (e.at("tid") == 0)
      starts[{e.at("pid").get<int>(), e.at("name").get<std::string>()}] = e.at("ts");
  }
  for (int r = 0; r < plan->num_ranks; ++r) {
    for (const schedule::TimedAction& t : sim->timeline[r]) {
      if (schedule::IsSendOrRecv(t.action.type)) continue;
      auto it = starts.find({r, t.action.ToString()});
      ASSERT_NE(it, starts.end()) << t.action.ToString();
      EXPECT_EQ(it->second, us(t.start)) << t.action.ToString();
    }
  }

  // One transfer per simulated message; each leaves at its SEND, ends no earlier than the SEND,
  // and has arrived when the receiving rank's consumer (F after RECV_F, B after RECV_B) starts.
  EXPECT_EQ(Events(doc, "s").size(), sim->messages.size());
  for (const schedule::Message& m : sim->messages) {
    const json send = Transfer(doc, m.send.ToString(), m.from_rank);
    const json recv = Transfer(doc, m.recv.ToString(), m.to_rank);
    const double send_post = Events(doc, "i", m.send.ToString(), m.from_rank).at(0).at("ts");
    EXPECT_EQ(send.at("ts").get<double>(), us(m.posted_send)) << m.send.ToString();
    const double arrive = recv.at("ts").get<double>() + recv.at("dur").get<double>();
    EXPECT_LE(send_post, arrive) << m.send.ToString();
    schedule::Action consumer = m.recv;
    consumer.type = m.recv.type == schedule::ActionType::kRecvF
                        ? schedule::ActionType::kForward
                        : schedule::ActionType::kFullBackward;
    auto it = starts.find({m.to_rank, consumer.ToString()});
    ASSERT_NE(it, starts.end()) << consumer.ToString();
    EXPECT_LE(arrive, it->second) << m.send.ToString() << " -> " << consumer.ToString();
  }
}

}  // namespace
}  // namespace stagecoach::coordinator::step_trace_test
