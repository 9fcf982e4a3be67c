// The numerical contract's reference for rows of whole documents (data.kind: tokens with
// data.packing; docs/spec.md "Documents"), written again from that description, sharing no code
// with the worker: the token stream cut after every EOS, documents of fewer than two tokens left
// out, and step k's rows drawn with generator(seed + 1 + k).
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace stagecoach::testing {

// A target the loss does not count.
inline constexpr int64_t kReferenceIgnored = -100;

// One step's whole batch: inputs and targets [B, T] (targets kReferenceIgnored where a row has
// no position), and with packing each position's document within its row (-1 on padding).
struct DocumentBatch {
  torch::Tensor inputs, targets, segments;
};

// A document as rows take it: its tokens, and per token whether predicting it counts in the
// loss (a fine-tuning record's response and EOS; every token of a tokens file's document).
struct ReferenceDocument {
  std::vector<int64_t> tokens;
  std::vector<bool> counted;
};

// Step `step`'s batch of `rows` rows of at most `seq` positions from `docs`: pad rows hold one
// document each, cut to seq; packed rows (`pack`) start with the drawn document and go on with
// the following ones in order while each fits whole (the first one cut to seq when it alone is
// longer). Padding inputs are `pad`; a target whose token does not count is ignored.
inline DocumentBatch ReferenceRows(const std::vector<ReferenceDocument>& docs, int64_t pad,
                                   bool pack, int64_t rows, int64_t seq, uint64_t seed,
                                   int64_t step) {
  const int64_t n = static_cast<int64_t>(docs.size());
  at::Generator gen = at::detail::createCPUGenerator(seed + 1 + static_cast<uint64_t>(step));
  const torch::Tensor first = torch::randint(0, n, {rows}, gen, torch::kInt64);
  DocumentBatch b;
  b.inputs = torch::full({rows, seq}, pad, torch::kInt64);
  b.targets = torch::full({rows, seq}, kReferenceIgnored, torch::kInt64);
  b.segments = torch::full({rows, seq}, -1, torch::kInt64);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t at = 0;
    for (int64_t k = 0; k < n; ++k) {
      const ReferenceDocument& d = docs[(first[r].item<int64_t>() + k) % n];
      const int64_t len = static_cast<int64_t>(d.tokens.size()) - 1;
      if (at > 0 && at + len > seq) break;
      for (int64_t i = 0; i < len && at < seq; ++i, ++at) {
        b.inputs[r][at] = d.tokens[i];
        b.targets[r][at] = d.counted[i + 1] ? d.tokens[i + 1] : kReferenceIgnored;
        b.segments[r][at] = k;
      }
      if (!pack || at == seq) break;
    }
  }
  return b;
}

// ReferenceRows over a tokens file's documents: `tokens` cut after every `eos` (a tail without
// one is a document too), those of fewer than two tokens left out, every target counted.
inline DocumentBatch ReferenceDocumentRows(const std::vector<int64_t>& tokens, int64_t eos,
                                           bool pack, int64_t rows, int64_t seq, uint64_t seed,
                                           int64_t step) {
  std::vector<ReferenceDocument> docs;
  ReferenceDocument current;
  for (size_t i = 0; i < tokens.size(); ++i) {
    current.tokens.push_back(tokens[i]);
    current.counted.push_back(true);
    if (tokens[i] == eos || i + 1 == tokens.size()) {
      if (current.tokens.size() >= 2) docs.push_back(current);
      current = ReferenceDocument();
    }
  }
  return ReferenceRows(docs, eos, pack, rows, seq, seed, step);
}

}  // namespace stagecoach::testing
