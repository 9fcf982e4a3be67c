#include "worker/model/kv_cache.h"

#include <torch/torch.h>

#include <algorithm>
#include <utility>

namespace stagecoach::model {

DecodePositions DecodePositions::Make(std::vector<int64_t> rows, std::vector<int64_t> starts,
                                      int64_t t, int64_t session_rows, int64_t max_positions,
                                      const torch::Device& device) {
  DecodePositions at;
  const int64_t n = static_cast<int64_t>(rows.size());
  at.rows = torch::tensor(rows, torch::kInt64).to(device);
  at.row_ids = std::move(rows);
  at.positions = (torch::tensor(starts, torch::kInt64).view({n, 1}) +
                  torch::arange(t, torch::kInt64).view({1, t}))
                     .to(device);
  at.length = *std::max_element(starts.begin(), starts.end()) + t;
  const torch::Tensor key_positions =
      torch::arange(at.length, torch::TensorOptions(torch::kInt64).device(device))
          .view({1, 1, 1, at.length});
  at.hidden = key_positions > at.positions.view({n, 1, t, 1});
  at.starts = std::move(starts);
  at.session_rows = session_rows;
  at.max_positions = max_positions;
  return at;
}

DecodePositions DecodePositions::Packed(const torch::Tensor& segments) {
  const int64_t b = segments.size(0), t = segments.size(1);
  const auto options = torch::TensorOptions(torch::kInt64).device(segments.device());
  const torch::Tensor index = torch::arange(t, options).view({1, t}).expand({b, t});
  // A document starts where the segment changes; each position counts from its start.
  const torch::Tensor starts_here =
      torch::cat({torch::ones({b, 1}, options.dtype(torch::kBool)),
                  segments.slice(1, 1).ne(segments.slice(1, 0, t - 1))},
                 1);
  const torch::Tensor start =
      std::get<0>(torch::where(starts_here, index, torch::zeros_like(index)).cummax(1));
  DecodePositions at;
  at.positions = index - start;
  at.length = t;
  at.hidden = index.view({b, 1, 1, t}) > index.view({b, 1, t, 1});
  at.hidden = at.hidden.logical_or(segments.view({b, 1, 1, t}) != segments.view({b, 1, t, 1}));
  at.session_rows = b;
  at.max_positions = t;
  return at;
}

void LayerKv::Reserve(const torch::Tensor& like, int64_t needed, const DecodePositions& at) {
  const int64_t capacity = keys_.defined() ? keys_.size(2) : 0;
  if (needed <= capacity && keys_.scalar_type() == like.scalar_type()) return;
  int64_t grown = std::max<int64_t>(capacity, 16);
  while (grown < needed) grown *= 2;
  grown = std::min(grown, at.max_positions);
  const auto options = like.options();
  torch::Tensor keys =
      torch::zeros({at.session_rows, like.size(1), grown, like.size(3)}, options);
  torch::Tensor values = torch::zeros_like(keys);
  if (capacity > 0) {
    keys.slice(2, 0, capacity).copy_(keys_);
    values.slice(2, 0, capacity).copy_(values_);
  }
  keys_ = std::move(keys);
  values_ = std::move(values);
}

std::pair<torch::Tensor, torch::Tensor> LayerKv::Append(const torch::Tensor& k,
                                                        const torch::Tensor& v,
                                                        const DecodePositions& at) {
  const int64_t n = k.size(0), t = k.size(2);
  Reserve(k, at.length, at);
  for (int64_t j = 0; j < n; ++j) {
    keys_[at.row_ids[j]].slice(1, at.starts[j], at.starts[j] + t).copy_(k[j]);
    values_[at.row_ids[j]].slice(1, at.starts[j], at.starts[j] + t).copy_(v[j]);
  }
  return {keys_.index_select(0, at.rows).slice(2, 0, at.length),
          values_.index_select(0, at.rows).slice(2, 0, at.length)};
}

int64_t LayerKv::bytes() const {
  if (!keys_.defined()) return 0;
  return static_cast<int64_t>(keys_.nbytes() + values_.nbytes());
}

int64_t StageKv::bytes() const {
  int64_t total = 0;
  for (const auto& [name, kv] : layers_) total += kv.bytes();
  return total;
}

}  // namespace stagecoach::model
