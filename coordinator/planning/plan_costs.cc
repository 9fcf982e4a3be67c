#include "coordinator/planning/plan_costs.h"

#include <algorithm>
#include <cmath>

namespace stagecoach::coordinator {

CostAssumptions DefaultCostAssumptions() {
  CostAssumptions a;
  a.message_latency_seconds = 100e-6;
  a.link_bytes_per_second = 2e9;
  a.message_cpu_seconds = 500e-6;
  return a;
}

namespace {

// Seconds of `rounds` ring messages of `bytes` each.
double RingSeconds(double rounds, double bytes, const CostAssumptions& a) {
  const double per_message = a.message_latency_seconds +
                             (a.link_bytes_per_second > 0 ? bytes / a.link_bytes_per_second : 0);
  return rounds * per_message;
}

// The replicas' collectives of each stage (see PlanCostModel), on the ranks' queues.
void AddCollectiveCosts(const Plan& plan, const CostAssumptions& assumptions,
                        schedule::CostModel& costs) {
  const double d = plan.replicas;
  costs.overlap_collectives = true;
  for (const StagePlan& stage : plan.stages) {
    const double shard_bytes = 4.0 * std::ceil(static_cast<double>(stage.parameters) / d);
    const double reduce_scatter = RingSeconds(d - 1, shard_bytes, assumptions);
    double reduce = 0;
    double unshard = 0;
    double after_step = 0;
    switch (plan.shard) {
      case spec::ShardLevel::kNone:
        reduce = 2 * reduce_scatter;  // an all-reduce: reduce-scatter, then all-gather
        break;
      case spec::ShardLevel::kOptimizer:
      case spec::ShardLevel::kGradients:
        reduce = reduce_scatter;
        after_step = reduce_scatter;  // the all-gather of the stepped shards
        break;
      case spec::ShardLevel::kParameters:
        reduce = reduce_scatter;
        unshard = reduce_scatter;  // an all-gather moves as many bytes
        break;
    }
    costs.per_stage_reduce_grad.push_back(reduce);
    costs.per_stage_unshard.push_back(unshard);
    costs.per_stage_after_step.push_back(after_step);
  }
}

}  // namespace

schedule::CostModel PlanCostModel(const Plan& plan, const CostAssumptions& assumptions) {
  schedule::CostModel costs;
  bool measured = false;
  const int last = static_cast<int>(plan.stages.size()) - 1;
  auto remote = [&](int a, int b) {
    return b >= 0 && b <= last && static_cast<size_t>(std::max(a, b)) < plan.stage_to_rank.size() &&
           plan.stage_to_rank[a] != plan.stage_to_rank[b];
  };
  for (const StagePlan& stage : plan.stages) {
    schedule::StageCosts c{0, 0, 0, 0};
    for (int l = stage.first_layer; l < stage.end_layer; ++l) {
      const v1::LayerInfo& layer = plan.layers[l];
      c.forward += layer.forward_seconds();
      c.backward += layer.backward_seconds();
      const bool split = layer.backward_input_seconds() > 0 || layer.backward_weight_seconds() > 0;
      c.backward_input += split ? layer.backward_input_seconds() : layer.backward_seconds() / 2;
      c.backward_weight += split ? layer.backward_weight_seconds() : layer.backward_seconds() / 2;
    }
    measured = measured || c.forward > 0 || c.backward > 0;
    const double messages = (remote(stage.stage, stage.stage - 1) ? 1 : 0) +
                            (remote(stage.stage, stage.stage + 1) ? 1 : 0);
    const double cpu = messages * assumptions.message_cpu_seconds;
    c.forward += cpu;
    c.backward += cpu;
    c.backward_input += cpu;
    costs.per_stage.push_back(c);
    costs.per_stage_message_bytes.push_back(
        stage.end_layer > stage.first_layer
            ? static_cast<double>(plan.layers[stage.end_layer - 1].output_bytes())
            : 0.0);
  }
  if (!measured) return schedule::CostModel();
  costs.latency = assumptions.message_latency_seconds;
  costs.bandwidth = assumptions.link_bytes_per_second;
  if (plan.replicas > 1) AddCollectiveCosts(plan, assumptions, costs);
  return costs;
}

std::vector<PredictedRankTime> PredictRankTimes(const Plan& plan,
                                                const CostAssumptions& assumptions,
                                                bool* in_seconds) {
  schedule::CostModel costs = PlanCostModel(plan, assumptions);
  *in_seconds = !costs.per_stage.empty();
  if (!*in_seconds) {
    double total = 0;
    for (const StagePlan& stage : plan.stages) total += static_cast<double>(stage.parameters);
    for (const StagePlan& stage : plan.stages) {
      const double f = total > 0 ? static_cast<double>(stage.parameters) / total
                                 : 1.0 / static_cast<double>(plan.stages.size());
      costs.per_stage.push_back({f, 2 * f, f, f});
    }
  }
  auto sim = schedule::Simulate(plan.lowered, plan.stage_to_rank, plan.num_stages,
                                plan.num_microbatches, costs);
  if (!sim.ok()) return {};
  double busy = 0;
  for (double b : sim->busy) busy += b;
  std::vector<PredictedRankTime> out;
  for (size_t r = 0; r < sim->busy.size(); ++r) {
    out.push_back({*in_seconds ? sim->busy[r] : (busy > 0 ? sim->busy[r] / busy : 0.0),
                   sim->bubble_ratio[r]});
  }
  return out;
}

}  // namespace stagecoach::coordinator
