// The key/value cache of cached decoding (WorkerService.Decode): what one stage of a built-in
// decoder keeps between the positions of a generation session, so that a new token attends to
// the keys and values of the earlier ones instead of recomputing them.
//
// A session has `rows` rows (prompts) of at most `max_positions` positions each. A decoding step
// runs some of the rows (DecodePositions: which, and where each one's new positions start) on
// T new positions; every attention layer appends its new keys and values at those positions
// (LayerKv::Append), dropping what the row held beyond its start, and attends to positions
// [0, start + i] for its i-th new position. Rows may be at different lengths (ragged prompts).
//
// Memory: per layer, keys and values [rows, kv_heads, capacity, head_dim] in the dtype they come
// in; capacity grows by doubling up to max_positions as positions are reached, so a short
// session never holds the bound. Not thread-safe: one decoding step at a time.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace stagecoach::model {

// Which rows of a session a decoding step runs, and where.
struct DecodePositions {
  // The session rows, distinct, each in [0, session rows); `rows` holds them as int64 [n] on
  // the stage's device.
  std::vector<int64_t> row_ids;
  torch::Tensor rows;
  // Per row: the positions it keeps from earlier steps (its inputs are positions
  // [starts[j], starts[j] + T)).
  std::vector<int64_t> starts;
  // int64 [n, T]: the absolute position of every input, starts[j] + i.
  torch::Tensor positions;
  // Positions every layer attends over: the largest start + T.
  int64_t length = 0;
  // bool [n, 1, T, length]: true where a key must not be attended to (after the query's
  // position, or beyond what the row holds); the same for every attention layer of the step.
  torch::Tensor hidden;
  int64_t session_rows = 1;
  int64_t max_positions = 1;

  // The positions of `starts` for T new inputs of every row, on `device`.
  static DecodePositions Make(std::vector<int64_t> rows, std::vector<int64_t> starts, int64_t t,
                              int64_t session_rows, int64_t max_positions,
                              const torch::Device& device);

  // Rows packed with several documents (StageModel::SetSegments), without a cache: `segments`
  // int64 [B, T] (-1 on padding, a document of its own). Each position is at its offset in its
  // document and hides every key that is after it or in another document; `length` is T.
  static DecodePositions Packed(const torch::Tensor& segments);
};

// One attention layer's keys and values for a session.
class LayerKv {
 public:
  // Stores `k` and `v` [n, kv_heads, T, head_dim] at `at`'s rows and positions; returns every
  // position [0, at.length) of those rows' keys and values [n, kv_heads, at.length, head_dim]
  // (attend to them under at.hidden).
  std::pair<torch::Tensor, torch::Tensor> Append(const torch::Tensor& k, const torch::Tensor& v,
                                                 const DecodePositions& at);
  int64_t bytes() const;

 private:
  // Grows keys_/values_ to hold `needed` positions (doubling, at most max_positions).
  void Reserve(const torch::Tensor& like, int64_t needed, const DecodePositions& at);

  torch::Tensor keys_, values_;  // [session rows, kv_heads, capacity, head_dim]
};

// A stage's caches: one LayerKv per attention layer, by the layer's name.
class StageKv {
 public:
  LayerKv& For(const std::string& layer) { return layers_[layer]; }
  int64_t bytes() const;

 private:
  std::map<std::string, LayerKv> layers_;
};

}  // namespace stagecoach::model
