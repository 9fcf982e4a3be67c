// How the executor tags the messages of a pipeline on the data plane, and which "links" (a kind
// of message over one stage boundary between two ranks) a rank uses. Torch-free: the transport
// set-up in the task runner needs it too.
//
// A tag is [payload:8][edge:28][microbatch:28]; edge e is the boundary between stages e and
// e+1, so both sides of a message name the same tag. The link of a tag is its top 36 bits
// (payload and edge): a transport that orders transfers per link (NCCL: one communicator per
// link) keeps each boundary's activations, gradients and shape messages apart, so that the
// order microbatches cross one link is the only order both sides must agree on.
#pragma once

#include <cstdint>
#include <vector>

namespace stagecoach::runtime {

enum class Payload : uint64_t { kActivation = 1, kGradient = 2, kShapes = 3 };

constexpr int kLinkShift = 28;

inline uint64_t MessageTag(Payload payload, int edge, int microbatch) {
  return (static_cast<uint64_t>(payload) << 56) | (static_cast<uint64_t>(edge) << kLinkShift) |
         static_cast<uint64_t>(microbatch);
}

inline uint64_t LinkOf(uint64_t tag) { return tag >> kLinkShift; }

struct Link {
  uint64_t link = 0;  // LinkOf of its tags
  int peer = 0;       // the other rank
};

// The links `rank` sends or receives on, given every stage's rank, in one order all ranks
// agree on (by edge, then payload): for each boundary between stages on different ranks, its
// activations, gradients (unless forward-only) and shape messages.
inline std::vector<Link> LinksOfRank(const std::vector<int>& stage_to_rank, int rank,
                                     bool forward_only) {
  std::vector<Link> out;
  for (size_t e = 0; e + 1 < stage_to_rank.size(); ++e) {
    const int from = stage_to_rank[e];
    const int to = stage_to_rank[e + 1];
    if (from == to || (from != rank && to != rank)) continue;
    const int peer = from == rank ? to : from;
    for (Payload p : {Payload::kActivation, Payload::kGradient, Payload::kShapes}) {
      if (forward_only && p == Payload::kGradient) continue;
      out.push_back(Link{LinkOf(MessageTag(p, static_cast<int>(e), 0)), peer});
    }
  }
  return out;
}

}  // namespace stagecoach::runtime
