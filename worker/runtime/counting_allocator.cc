#include "worker/runtime/counting_allocator.h"

#include <c10/core/CPUAllocator.h>

#include <utility>

namespace stagecoach::runtime {
namespace {

// What a counted allocation holds: the wrapped allocator's DataPtr (freed with this), its size
// and the counter to give it back to.
struct Counted {
  c10::DataPtr inner;
  int64_t bytes = 0;
  std::atomic<int64_t>* live = nullptr;
};

// Priority above LibTorch's own CPU allocators, so that none replaces this one later.
constexpr uint8_t kPriority = 200;

}  // namespace

CountingCpuAllocator& CountingCpuAllocator::Install() {
  static CountingCpuAllocator* const counter = [] {
    auto* made = new CountingCpuAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(made, kPriority);
    return made;
  }();
  return *counter;
}

c10::DataPtr CountingCpuAllocator::allocate(size_t bytes) const {
  c10::DataPtr inner = wrapped_->allocate(bytes);
  void* data = inner.get();
  const c10::Device device = inner.device();
  auto* counted = new Counted{std::move(inner), static_cast<int64_t>(bytes), &live_};
  const int64_t live = live_.fetch_add(counted->bytes, std::memory_order_relaxed) + counted->bytes;
  int64_t peak = peak_.load(std::memory_order_relaxed);
  while (live > peak && !peak_.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
  return c10::DataPtr(data, counted, &CountingCpuAllocator::Release, device);
}

void CountingCpuAllocator::Release(void* context) {
  auto* counted = static_cast<Counted*>(context);
  counted->live->fetch_sub(counted->bytes, std::memory_order_relaxed);
  delete counted;  // frees the wrapped allocation
}

}  // namespace stagecoach::runtime
