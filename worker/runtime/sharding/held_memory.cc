#include "worker/runtime/sharding/held_memory.h"

#include <torch/torch.h>

#include <set>
#include <vector>

#include "worker/runtime/device/counting_allocator.h"

namespace stagecoach::runtime {
namespace {

// Adds the bytes behind `t`'s storage to `total` unless `seen` holds it already.
void Add(const torch::Tensor& t, std::set<const void*>& seen, int64_t& total) {
  if (!t.defined() || !t.has_storage()) return;
  const c10::Storage& storage = t.storage();
  const void* key = storage.data_ptr().get();
  if (key == nullptr || !seen.insert(key).second) return;
  const int64_t counted = CountingCpuAllocator::CountedBytes(storage);
  total += counted >= 0 ? counted : static_cast<int64_t>(storage.nbytes());
}

}  // namespace

HeldMemory MeasureHeldMemory(const std::map<int, model::StageModel*>& stages,
                             const ZeroShards* shards) {
  HeldMemory out;
  std::set<const void*> params_seen, grads_seen;
  for (const auto& [s, stage] : stages) {
    for (const torch::Tensor& p : stage->Parameters()) {
      Add(p, params_seen, out.parameter_bytes);
      Add(p.grad(), grads_seen, out.gradient_bytes);
    }
  }
  if (shards != nullptr) {
    for (const torch::Tensor& shard : shards->ShardParameters()) {
      Add(shard, params_seen, out.parameter_bytes);
      Add(shard.grad(), grads_seen, out.gradient_bytes);
    }
  }
  return out;
}

}  // namespace stagecoach::runtime
