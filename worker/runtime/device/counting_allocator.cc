#include "worker/runtime/device/counting_allocator.h"

#include <c10/core/CPUAllocator.h>

#include <new>
#include <utility>

namespace stagecoach::runtime {
namespace {

// Each allocation is the wrapped allocator's block with this header in front of the bytes handed
// out: the wrapped DataPtr (freed with the header) and the size. The data pointer is also the
// DataPtr's context, as Allocator::raw_allocate requires (LibTorch's own kernels allocate raw
// workspaces that way).
struct Header {
  c10::DataPtr inner;
  int64_t bytes = 0;
};
// A multiple of LibTorch's CPU alignment (64 bytes), so the bytes after it keep the alignment.
constexpr size_t kHeaderBytes = 64;
static_assert(sizeof(Header) <= kHeaderBytes, "the header must fit its slot");

// Priority above LibTorch's own CPU allocators, so that none replaces this one later.
constexpr uint8_t kPriority = 200;

CountingCpuAllocator* g_counter = nullptr;

}  // namespace

CountingCpuAllocator& CountingCpuAllocator::Install() {
  static CountingCpuAllocator* const counter = [] {
    auto* made = new CountingCpuAllocator(c10::GetCPUAllocator());
    g_counter = made;
    c10::SetCPUAllocator(made, kPriority);
    return made;
  }();
  return *counter;
}

c10::DataPtr CountingCpuAllocator::allocate(size_t bytes) STAGECOACH_ALLOCATE_CONST {
  c10::DataPtr inner = wrapped_->allocate(bytes + kHeaderBytes);
  auto* block = static_cast<char*>(inner.get());
  const c10::Device device = inner.device();
  auto* header = new (block) Header{std::move(inner), static_cast<int64_t>(bytes)};
  const int64_t live = live_.fetch_add(header->bytes, std::memory_order_relaxed) + header->bytes;
  int64_t peak = peak_.load(std::memory_order_relaxed);
  while (live > peak && !peak_.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
  void* data = block + kHeaderBytes;
  return c10::DataPtr(data, data, &CountingCpuAllocator::Release, device);
}

#if STAGECOACH_TORCH_AT_LEAST(2, 1)
void CountingCpuAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  default_copy_data(dest, src, count);
}
#endif

int64_t CountingCpuAllocator::CountedBytes(const c10::Storage& storage) {
  const c10::DataPtr& data = storage.data_ptr();
  if (data.get() == nullptr || data.get_deleter() != &CountingCpuAllocator::Release) return -1;
  const auto* header =
      reinterpret_cast<const Header*>(static_cast<const char*>(data.get_context()) - kHeaderBytes);
  return header->bytes;
}

c10::DeleterFnPtr CountingCpuAllocator::raw_deleter() const {
  return &CountingCpuAllocator::Release;
}

void CountingCpuAllocator::Release(void* data) {
  auto* header = reinterpret_cast<Header*>(static_cast<char*>(data) - kHeaderBytes);
  g_counter->live_.fetch_sub(header->bytes, std::memory_order_relaxed);
  c10::DataPtr inner = std::move(header->inner);
  header->~Header();
  // `inner` frees the block as it goes out of scope.
}

}  // namespace stagecoach::runtime
