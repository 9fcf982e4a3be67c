// How the executor tags the messages of a pipeline on the data plane, and which "links" (a kind
// of message over one stage boundary between two ranks) a rank uses. Torch-free: the transport
// set-up in the task runner needs it too.
//
// A tag is [payload:8][edge:28][microbatch:28]; edge e is the boundary between stages e and
// e+1, so both sides of a message name the same tag. A skip connection (values stage p sends
// straight to a later, non-adjacent stage c) has an edge of its own: bit 27 set, then p and c
// (13 bits each; PairEdge). The link of a tag is its top 36 bits
// (payload and edge): a transport that orders transfers per link (NCCL: one communicator per
// link) keeps each boundary's activations, gradients and shape messages apart, so that the
// order microbatches cross one link is the only order both sides must agree on.
#pragma once

#include <cstdint>
#include <vector>

namespace stagecoach::runtime {

// kJobReduction: the small per-step reduction of every rank's gradient statistics (norm and
// non-finite flags, job_reduction.h), passed along the ranks' chain: edge r is the boundary
// between ranks r and r+1 (not stages). kTiedGradients: the gradients of a parameter the first
// and last stages both hold (tied_parameters.h), edge 0.
enum class Payload : uint64_t {
  kActivation = 1,
  kGradient = 2,
  kShapes = 3,
  kJobReduction = 4,
  kTiedGradients = 5
};

constexpr int kLinkShift = 28;

inline uint64_t MessageTag(Payload payload, int edge, int microbatch) {
  return (static_cast<uint64_t>(payload) << 56) | (static_cast<uint64_t>(edge) << kLinkShift) |
         static_cast<uint64_t>(microbatch);
}

inline uint64_t LinkOf(uint64_t tag) { return tag >> kLinkShift; }

// The edge of the values stage `producer` sends to stage `consumer` (> producer).
inline int PairEdge(int producer, int consumer) {
  if (consumer == producer + 1) return producer;
  return (1 << 27) | (producer << 13) | consumer;
}

// A producer -> consumer pair of stages that are not adjacent (a skip connection).
struct SkipPair {
  int producer = 0;
  int consumer = 0;
};

struct Link {
  uint64_t link = 0;  // LinkOf of its tags
  int peer = 0;       // the other rank
};

// The links `rank` sends or receives on, given every stage's rank, in one order all ranks
// agree on (adjacent boundaries by edge, then the skip pairs in the order given; by payload
// within each): for each boundary or skip pair between stages on different ranks, its
// activations, gradients (unless forward-only) and shape messages; then, unless forward-only,
// the job reduction's links to rank-1 and rank+1, and with `tied_ends` (the first and last
// stages hold copies of one parameter) the tied gradients' link between their ranks.
inline std::vector<Link> LinksOfRank(const std::vector<int>& stage_to_rank, int rank,
                                     bool forward_only, const std::vector<SkipPair>& skips = {},
                                     bool tied_ends = false) {
  std::vector<Link> out;
  auto add = [&](int producer, int consumer) {
    const int from = stage_to_rank[producer];
    const int to = stage_to_rank[consumer];
    if (from == to || (from != rank && to != rank)) return;
    const int peer = from == rank ? to : from;
    for (Payload p : {Payload::kActivation, Payload::kGradient, Payload::kShapes}) {
      if (forward_only && p == Payload::kGradient) continue;
      out.push_back(Link{LinkOf(MessageTag(p, PairEdge(producer, consumer), 0)), peer});
    }
  };
  for (size_t e = 0; e + 1 < stage_to_rank.size(); ++e) {
    add(static_cast<int>(e), static_cast<int>(e) + 1);
  }
  for (const SkipPair& skip : skips) add(skip.producer, skip.consumer);
  if (!forward_only) {
    int ranks = 0;
    for (int r : stage_to_rank) ranks = r + 1 > ranks ? r + 1 : ranks;
    for (int r = 0; r + 1 < ranks; ++r) {
      if (r != rank && r + 1 != rank) continue;
      out.push_back(Link{LinkOf(MessageTag(Payload::kJobReduction, r, 0)), r == rank ? r + 1 : r});
    }
    const int first = stage_to_rank.front(), last = stage_to_rank.back();
    if (tied_ends && first != last && (rank == first || rank == last)) {
      out.push_back(
          Link{LinkOf(MessageTag(Payload::kTiedGradients, 0, 0)), rank == first ? last : first});
    }
  }
  return out;
}

}  // namespace stagecoach::runtime
