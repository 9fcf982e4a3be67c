// The live-tensor bytes of this process's LibTorch CPU tensors and their peak: a CPU allocator
// that wraps the one LibTorch had (c10::GetCPUAllocator) and counts every allocation until its
// memory is freed. What activation recomputation saves, and what a rank's step really keeps,
// are read from it (peak - live at the step's start = the step's activation peak).
//
// Counts only what LibTorch allocates through its CPU allocator after Install (tensor storage;
// not the allocator's own overhead, not CUDA memory). Process-wide: in a process that runs
// several ranks as threads the counts are their sum.
//
// Thread-safe.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/Storage.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "worker/runtime/device/torch_version.h"

namespace stagecoach::runtime {

class CountingCpuAllocator final : public c10::Allocator {
 public:
  // Installs the counter as LibTorch's CPU allocator the first time (later calls return the
  // same counter); it lives as long as the process.
  static CountingCpuAllocator& Install();

  // Bytes of the tensors allocated since Install and not freed yet, and the most there were
  // since the last ResetPeak (or Install).
  int64_t live_bytes() const { return live_.load(std::memory_order_relaxed); }
  int64_t peak_bytes() const { return peak_.load(std::memory_order_relaxed); }
  // Starts a new peak at the current live bytes.
  void ResetPeak() { peak_.store(live_bytes(), std::memory_order_relaxed); }
  // The bytes counted for the allocation behind `storage` (the whole block, shared by every
  // tensor that views part of it), or -1 when it is not one of this allocator's (allocated
  // before Install, by another allocator, or on another device).
  static int64_t CountedBytes(const c10::Storage& storage);

  // The data pointer is also the context (raw_allocate and raw_deallocate work); each block
  // carries a 64-byte header in front, not counted.
  c10::DataPtr allocate(size_t bytes) STAGECOACH_ALLOCATE_CONST override;
  c10::DeleterFnPtr raw_deleter() const override;
#if STAGECOACH_TORCH_AT_LEAST(2, 1)
  // Allocator::clone's copy (pure virtual from 2.1 on): a plain memcpy of the payload.
  void copy_data(void* dest, const void* src, std::size_t count) const override;
#endif

 private:
  explicit CountingCpuAllocator(c10::Allocator* wrapped) : wrapped_(wrapped) {}
  // The deleter of every DataPtr this allocator returns: `data` is what allocate handed out.
  static void Release(void* data);

  c10::Allocator* const wrapped_;
  mutable std::atomic<int64_t> live_{0};
  mutable std::atomic<int64_t> peak_{0};
};

}  // namespace stagecoach::runtime
