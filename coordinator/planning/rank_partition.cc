#include "coordinator/planning/rank_partition.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace stagecoach::coordinator {
namespace {

constexpr int64_t kNoBound = std::numeric_limits<int64_t>::max();

// The layers' prefix sums and the placement, with what the search asks of them.
struct Problem {
  int n = 0;                   // layers
  int stages = 0;              // S
  std::vector<int64_t> prefix;  // prefix[i]: cost of layers [0, i)
  std::vector<int> rank_of;     // by stage
  int ranks = 0;
  // ranks_from[s]: the distinct ranks of stages s..S-1, ascending (the ranks whose totals can
  // still grow once stage s starts); stages_from[s][k]: how many of those stages rank
  // ranks_from[s][k] holds.
  std::vector<std::vector<int>> ranks_from;
  std::vector<std::vector<int>> stages_from;

  int64_t Cost(int a, int b) const { return prefix[b] - prefix[a]; }
  int64_t Total() const { return prefix[n]; }
};

// Costs whose sum would not fit in 62 bits are scaled down (proportions are what a split
// balances); a negative cost counts as 0.
Problem MakeProblem(const std::vector<int64_t>& costs, const std::vector<int>& stage_to_rank) {
  Problem pb;
  pb.n = static_cast<int>(costs.size());
  pb.stages = static_cast<int>(stage_to_rank.size());
  long double total = 0;
  for (int64_t c : costs) total += std::max<int64_t>(0, c);
  const long double limit = 0x1p62L;
  const long double scale = total > limit ? limit / total : 1.0L;
  pb.prefix.assign(pb.n + 1, 0);
  for (int i = 0; i < pb.n; ++i) {
    const int64_t c = std::max<int64_t>(0, costs[i]);
    pb.prefix[i + 1] =
        pb.prefix[i] + (scale < 1 ? static_cast<int64_t>(std::floor(c * scale)) : c);
  }
  pb.rank_of = stage_to_rank;
  pb.ranks = 1 + *std::max_element(stage_to_rank.begin(), stage_to_rank.end());
  pb.ranks_from.assign(pb.stages + 1, {});
  pb.stages_from.assign(pb.stages + 1, {});
  std::map<int, int> held;
  for (int s = pb.stages - 1; s >= 0; --s) {
    ++held[pb.rank_of[s]];
    for (const auto& [rank, count] : held) {
      pb.ranks_from[s].push_back(rank);
      pb.stages_from[s].push_back(count);
    }
  }
  return pb;
}

struct Evaluation {
  int64_t largest_rank = 0;
  int64_t largest_stage = 0;
};

Evaluation Evaluate(const Problem& pb, const std::vector<int>& firsts) {
  std::vector<int64_t> totals(pb.ranks, 0);
  Evaluation e;
  for (int s = 0; s < pb.stages; ++s) {
    const int end = s + 1 < pb.stages ? firsts[s + 1] : pb.n;
    const int64_t c = pb.Cost(firsts[s], end);
    totals[pb.rank_of[s]] += c;
    e.largest_stage = std::max(e.largest_stage, c);
  }
  e.largest_rank = *std::max_element(totals.begin(), totals.end());
  return e;
}

// The local search's objective: the largest rank, how many ranks reach it, the largest stage,
// how many stages reach it; smaller is better. The counts let a move that evens out one of two
// equally loaded ranks count as progress.
using LocalKey = std::tuple<int64_t, int, int64_t, int>;

LocalKey KeyOf(const std::vector<int64_t>& rank_totals, const std::vector<int64_t>& stage_costs) {
  const int64_t m = *std::max_element(rank_totals.begin(), rank_totals.end());
  const int64_t c = *std::max_element(stage_costs.begin(), stage_costs.end());
  return {m, static_cast<int>(std::count(rank_totals.begin(), rank_totals.end(), m)), c,
          static_cast<int>(std::count(stage_costs.begin(), stage_costs.end(), c))};
}

// From `firsts`, moves one boundary at a time to the place between its neighbours that lowers
// LocalKey the most, until no move lowers it (at most 8 x stages + 16 moves).
std::vector<int> LocalSearch(const Problem& pb, std::vector<int> firsts) {
  const int S = pb.stages;
  auto end_of = [&](int s) { return s + 1 < S ? firsts[s + 1] : pb.n; };
  std::vector<int64_t> stage_costs(S), totals(pb.ranks, 0);
  for (int s = 0; s < S; ++s) {
    stage_costs[s] = pb.Cost(firsts[s], end_of(s));
    totals[pb.rank_of[s]] += stage_costs[s];
  }
  LocalKey key = KeyOf(totals, stage_costs);
  for (int move = 0; move < 8 * S + 16; ++move) {
    LocalKey best = key;
    int best_b = -1, best_x = -1;
    for (int b = 1; b < S; ++b) {
      const int lo = firsts[b - 1] + 1, hi = end_of(b) - 1;
      const int ra = pb.rank_of[b - 1], rb = pb.rank_of[b];
      const int64_t ca = stage_costs[b - 1], cb = stage_costs[b];
      for (int x = lo; x <= hi; ++x) {
        if (x == firsts[b]) continue;
        const int64_t na = pb.Cost(firsts[b - 1], x), nb = pb.Cost(x, end_of(b));
        totals[ra] += na - ca;
        totals[rb] += nb - cb;
        stage_costs[b - 1] = na;
        stage_costs[b] = nb;
        const LocalKey k = KeyOf(totals, stage_costs);
        if (k < best) {
          best = k;
          best_b = b;
          best_x = x;
        }
        totals[ra] -= na - ca;
        totals[rb] -= nb - cb;
        stage_costs[b - 1] = ca;
        stage_costs[b] = cb;
      }
    }
    if (best_b < 0) break;
    const int b = best_b;
    const int64_t na = pb.Cost(firsts[b - 1], best_x), nb = pb.Cost(best_x, end_of(b));
    totals[pb.rank_of[b - 1]] += na - stage_costs[b - 1];
    totals[pb.rank_of[b]] += nb - stage_costs[b];
    stage_costs[b - 1] = na;
    stage_costs[b] = nb;
    firsts[b] = best_x;
    key = best;
  }
  return firsts;
}

// A depth-first search for a cut whose every rank total is at most `rank_bound` and every stage
// at most `stage_bound`, stage by stage from the first. Trying each stage's end from the
// furthest (descending) finds a cut quickly; from the nearest (ascending), the first cut found
// is the one whose boundaries come first. A state (stage s starting at layer i, with the
// totals of the ranks still to come) that failed under some bounds fails again under bounds no
// larger and with totals no smaller: such states are remembered and not searched again.
class CutSearch {
 public:
  enum class Result { kFound, kNone, kOutOfBudget };

  CutSearch(const Problem& pb, const PlanOptions& options, int64_t& nodes_left)
      : pb_(pb), options_(options), nodes_left_(nodes_left) {}

  // Spends at most `budget` of the shared node budget.
  absl::StatusOr<Result> Find(int64_t rank_bound, int64_t stage_bound, bool ascending,
                              std::vector<int>& firsts, int64_t budget) {
    const int64_t before = nodes_left_;
    const int64_t slice = std::min(before, std::max<int64_t>(budget, 0));
    nodes_left_ = slice;
    auto result = FindWithin(rank_bound, stage_bound, ascending, firsts);
    nodes_left_ = before - (slice - nodes_left_);
    return result;
  }

  int64_t nodes_left() const { return nodes_left_; }

 private:
  absl::StatusOr<Result> FindWithin(int64_t rank_bound, int64_t stage_bound, bool ascending,
                                    std::vector<int>& firsts) {
    rank_bound_ = rank_bound;
    stage_bound_ = stage_bound;
    ascending_ = ascending;
    used_.assign(pb_.ranks, 0);
    cut_.assign(pb_.stages, 0);
    out_of_budget_ = false;
    ASSIGN_OR_RETURN(bool found, Search(0, 0));
    if (found) {
      firsts = cut_;
      return Result::kFound;
    }
    return out_of_budget_ ? Result::kOutOfBudget : Result::kNone;
  }

  struct Failure {
    int64_t rank_bound;
    int64_t stage_bound;
    std::vector<int64_t> used;  // of pb_.ranks_from[s], in its order
  };
  static constexpr size_t kFailuresPerState = 16;
  // Bounds the memory of the remembered failures (each holds a total per rank still to come).
  static constexpr int64_t kFailuresInAll = 1 << 18;

  int64_t Key(int s, int i) const { return static_cast<int64_t>(s) * (pb_.n + 1) + i; }

  bool KnownToFail(int s, int i) const {
    auto it = failures_.find(Key(s, i));
    if (it == failures_.end()) return false;
    const std::vector<int>& active = pb_.ranks_from[s];
    for (const Failure& f : it->second) {
      if (f.rank_bound < rank_bound_ || f.stage_bound < stage_bound_) continue;
      bool dominated = true;
      for (size_t k = 0; k < active.size() && dominated; ++k) {
        dominated = f.used[k] <= used_[active[k]];
      }
      if (dominated) return true;
    }
    return false;
  }

  void RememberFailure(int s, int i) {
    if (remembered_ >= kFailuresInAll) return;
    std::vector<Failure>& list = failures_[Key(s, i)];
    if (list.size() >= kFailuresPerState) return;
    ++remembered_;
    Failure f{rank_bound_, stage_bound_, {}};
    for (int r : pb_.ranks_from[s]) f.used.push_back(used_[r]);
    list.push_back(std::move(f));
  }

  // What a rank with `room` left under rank_bound can still take in `stages` more stages.
  long double Capacity(int64_t room, int stages) const {
    long double most = static_cast<long double>(room);
    if (stage_bound_ != kNoBound) {
      most = std::min(most, static_cast<long double>(stages) * stage_bound_);
    }
    return std::max<long double>(0, most);
  }

  // The first layer index e in [lo, hi] with prefix[e] >= value (hi + 1 when none).
  int FirstAtLeast(int lo, int hi, int64_t value) const {
    return static_cast<int>(std::lower_bound(pb_.prefix.begin() + lo, pb_.prefix.begin() + hi + 1,
                                             value) -
                            pb_.prefix.begin());
  }
  // The last e in [lo, hi] with prefix[e] <= value (lo - 1 when none).
  int LastAtMost(int lo, int hi, int64_t value) const {
    return static_cast<int>(std::upper_bound(pb_.prefix.begin() + lo, pb_.prefix.begin() + hi + 1,
                                             value) -
                            pb_.prefix.begin()) -
           1;
  }

  absl::StatusOr<bool> Search(int s, int i) {
    if (s == pb_.stages) return i == pb_.n;
    if (nodes_left_ <= 0) {
      out_of_budget_ = true;
      return false;
    }
    if ((--nodes_left_ & 4095) == 0) {
      RETURN_IF_ERROR(options_.Interrupted("balancing the ranks' stages"));
    }
    if (KnownToFail(s, i)) return false;
    const int r = pb_.rank_of[s];
    const int later = pb_.stages - 1 - s;  // stages after this one
    int lo = i + 1, hi = pb_.n - later;
    if (lo > hi) return false;
    // This stage within both bounds.
    const int64_t room = std::min(stage_bound_, rank_bound_ - used_[r]);
    if (room < 0) return false;
    hi = LastAtMost(lo, hi, pb_.prefix[i] + std::min(room, pb_.Total()));
    if (lo > hi) {
      RememberFailure(s, i);
      return false;
    }
    // What is left after this stage must fit the later stages: at most stage_bound each, and
    // for each rank that holds some of them, at most its room under rank_bound. `others` is
    // that capacity without rank r's; r's own depends on this stage's cost.
    const std::vector<int>& rest = pb_.ranks_from[s + 1];
    const std::vector<int>& rest_stages = pb_.stages_from[s + 1];
    long double others = 0;
    int r_later_stages = 0;
    for (size_t k = 0; k < rest.size(); ++k) {
      if (rest[k] == r) {
        r_later_stages = rest_stages[k];
      } else {
        others += Capacity(rank_bound_ - used_[rest[k]], rest_stages[k]);
      }
    }
    if (later > 0 && r_later_stages == 0) {
      // Ends at or after the first e whose rest fits: prefix[n] - prefix[e] <= others.
      const long double need = pb_.Total() - others;
      if (need > 0) {
        if (need > static_cast<long double>(pb_.prefix[hi])) {
          RememberFailure(s, i);
          return false;
        }
        lo = std::max(lo, FirstAtLeast(lo, hi, static_cast<int64_t>(std::ceil(need))));
      }
    }
    if (later == 0) {
      if (hi != pb_.n) {  // the last stage must end at the last layer
        RememberFailure(s, i);
        return false;
      }
      lo = pb_.n;
    }
    // Ascending: nearest end first. Otherwise from the end whose stage is nearest its share of
    // what is left (the left-over cost over the stages left), outwards.
    int centre = lo;
    if (!ascending_ && lo < hi) {
      const int64_t share = (pb_.Total() - pb_.prefix[i]) / (pb_.stages - s);
      centre = std::min(hi, FirstAtLeast(lo, hi, pb_.prefix[i] + share));
    }
    for (int k = 0; lo <= hi && k <= hi - lo; ++k) {
      int e = lo + k;
      if (!ascending_) {
        // centre, centre - 1, centre + 1, ... while both sides last, then the rest of one side.
        const int below = centre - lo, above = hi - centre;
        const int paired = 2 * std::min(below, above);
        if (k == 0) {
          e = centre;
        } else if (k <= paired) {
          e = k % 2 == 1 ? centre - (k + 1) / 2 : centre + k / 2;
        } else {
          e = below > above ? centre - (k - paired + above) : centre + (k - paired + below);
        }
      }
      const int64_t c = pb_.Cost(i, e);
      if (c > room) continue;
      if (r_later_stages > 0 &&
          static_cast<long double>(pb_.Total() - pb_.prefix[e]) >
              others + Capacity(rank_bound_ - used_[r] - c, r_later_stages)) {
        continue;
      }
      cut_[s] = i;
      used_[r] += c;
      ASSIGN_OR_RETURN(bool found, Search(s + 1, e));
      used_[r] -= c;
      if (found) return true;
      if (out_of_budget_) return false;
    }
    RememberFailure(s, i);
    return false;
  }

  const Problem& pb_;
  const PlanOptions& options_;
  int64_t& nodes_left_;
  int64_t rank_bound_ = 0;
  int64_t stage_bound_ = 0;
  bool ascending_ = false;
  bool out_of_budget_ = false;
  std::vector<int64_t> used_;
  std::vector<int> cut_;
  std::unordered_map<int64_t, std::vector<Failure>> failures_;
  int64_t remembered_ = 0;
};

// Lowers `hi` (the value `witness` reaches) towards the smallest value in [lo, hi] for which
// `find` finds a cut, each cut found lowering hi to what it reaches (`reach`). Bisects, each
// probe given a quarter of the budget left; a probe undecided within its share is followed by
// one that asks only for a cut below hi (easy to find when there is one), and the search goes
// on from there. Returns whether hi was proven the smallest.
using FindFn = std::function<absl::StatusOr<CutSearch::Result>(int64_t bound, std::vector<int>&,
                                                               int64_t budget)>;
absl::StatusOr<bool> Minimize(int64_t lo, int64_t& hi, std::vector<int>& witness,
                              const CutSearch& search, const FindFn& find,
                              const std::function<int64_t(const std::vector<int>&)>& reach) {
  using Result = CutSearch::Result;
  while (lo < hi) {
    if (search.nodes_left() <= 0) return false;
    const int64_t share = std::max<int64_t>(search.nodes_left() / 4, 1024);
    std::vector<int> cut;
    ASSIGN_OR_RETURN(Result result, find(lo + (hi - lo) / 2, cut, share));
    if (result == Result::kNone) {
      lo = lo + (hi - lo) / 2 + 1;
      continue;
    }
    if (result == Result::kOutOfBudget) {
      ASSIGN_OR_RETURN(result, find(hi - 1, cut, share));
      if (result == Result::kNone) return true;
      if (result == Result::kOutOfBudget) return false;
    }
    witness = std::move(cut);
    hi = reach(witness);
  }
  return true;
}

bool OneStagePerRankOrOneRank(const std::vector<int>& stage_to_rank) {
  std::set<int> ranks(stage_to_rank.begin(), stage_to_rank.end());
  return ranks.size() == 1 || ranks.size() == stage_to_rank.size();
}

}  // namespace

std::vector<int64_t> RankTotals(const std::vector<int64_t>& costs,
                                const std::vector<int>& stage_to_rank,
                                const std::vector<int>& firsts) {
  const int stages = static_cast<int>(firsts.size());
  const int ranks = stage_to_rank.empty()
                        ? 0
                        : 1 + *std::max_element(stage_to_rank.begin(), stage_to_rank.end());
  std::vector<int64_t> totals(ranks, 0);
  for (int s = 0; s < stages; ++s) {
    const int end = s + 1 < stages ? firsts[s + 1] : static_cast<int>(costs.size());
    for (int l = firsts[s]; l < end; ++l) totals[stage_to_rank[s]] += std::max<int64_t>(0, costs[l]);
  }
  return totals;
}

absl::StatusOr<RankPartition> PartitionPerRank(const std::vector<int64_t>& costs,
                                               const std::vector<int>& stage_to_rank,
                                               const PlanOptions& options, int64_t node_budget) {
  const int S = static_cast<int>(stage_to_rank.size());
  if (S < 1 || S > static_cast<int>(costs.size())) {
    return absl::InvalidArgumentError(absl::StrCat("cannot split ", costs.size(), " layers into ",
                                                   S, " non-empty stages"));
  }
  for (int r : stage_to_rank) {
    if (r < 0) return absl::InvalidArgumentError(absl::StrCat("stage on rank ", r));
  }
  const Problem pb = MakeProblem(costs, stage_to_rank);
  RankPartition out;
  if (OneStagePerRankOrOneRank(stage_to_rank)) {
    // A rank's total is its stage's cost (or every rank's the model's): the stage-balanced cut,
    // which PartitionBalanced proves.
    ASSIGN_OR_RETURN(out.firsts, PartitionBalanced(costs, S, options));
  } else {
    ASSIGN_OR_RETURN(std::vector<int> balanced, PartitionBalanced(costs, S, options));
    std::vector<int> best = LocalSearch(pb, std::move(balanced));
    int64_t nodes_left = node_budget;
    CutSearch search(pb, options, nodes_left);
    // 1. The largest rank: at least the mean over the ranks and the heaviest layer.
    int64_t heaviest = 0;
    for (int l = 0; l < pb.n; ++l) heaviest = std::max(heaviest, pb.Cost(l, l + 1));
    const int64_t used_ranks = static_cast<int64_t>(pb.ranks_from[0].size());
    int64_t rank_hi = Evaluate(pb, best).largest_rank;
    const int64_t rank_lo =
        std::min(rank_hi, std::max(heaviest, (pb.Total() + used_ranks - 1) / used_ranks));
    ASSIGN_OR_RETURN(
        bool rank_proven,
        Minimize(
            rank_lo, rank_hi, best, search,
            [&](int64_t bound, std::vector<int>& cut, int64_t budget) {
              return search.Find(bound, kNoBound, /*ascending=*/false, cut, budget);
            },
            [&](const std::vector<int>& cut) { return Evaluate(pb, cut).largest_rank; }));
    // 2. The largest stage, with ranks held to the first.
    int64_t stage_hi = Evaluate(pb, best).largest_stage;
    const int64_t stage_lo = std::min(stage_hi, std::max(heaviest, (pb.Total() + S - 1) / S));
    bool stage_proven = false;
    if (rank_proven) {
      ASSIGN_OR_RETURN(
          stage_proven,
          Minimize(
              stage_lo, stage_hi, best, search,
              [&](int64_t bound, std::vector<int>& cut, int64_t budget) {
                return search.Find(rank_hi, bound, /*ascending=*/false, cut, budget);
              },
              [&](const std::vector<int>& cut) { return Evaluate(pb, cut).largest_stage; }));
    }
    // 3. The cut whose boundaries come first, under both.
    bool first_proven = false;
    if (stage_proven) {
      std::vector<int> cut;
      ASSIGN_OR_RETURN(CutSearch::Result result, search.Find(rank_hi, stage_hi, /*ascending=*/true,
                                                             cut, search.nodes_left()));
      if (result == CutSearch::Result::kFound) {
        best = std::move(cut);
        first_proven = true;
      }
    }
    out.firsts = std::move(best);
    out.proven = rank_proven && stage_proven && first_proven;
  }
  const Evaluation e = Evaluate(pb, out.firsts);
  out.largest_rank = e.largest_rank;
  out.largest_stage = e.largest_stage;
  return out;
}

}  // namespace stagecoach::coordinator
