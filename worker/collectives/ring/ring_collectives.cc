// Ring collectives (factory.h) on a transport of the group. One call at a time: a call's
// transfers carry tags (call sequence number, ring step), so a late message of one call can
// never be taken for another's.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/util/status_macros.h"
#include "worker/collectives/ring/factory.h"

namespace stagecoach::collectives {
namespace {

using transport::Transport;
using transport::Work;

int Mod(int a, int n) { return ((a % n) + n) % n; }

// Element offsets of n chunks of `count` elements: sizes differ by at most one, larger first.
std::vector<int64_t> ChunkOffsets(int64_t count, int n) {
  std::vector<int64_t> begin(n + 1, 0);
  for (int i = 0; i < n; ++i) begin[i + 1] = begin[i] + count / n + (i < count % n ? 1 : 0);
  return begin;
}

// Offsets of n equal blocks of `count` elements.
std::vector<int64_t> BlockOffsets(int64_t count, int n) {
  std::vector<int64_t> begin(n + 1, 0);
  for (int i = 0; i < n; ++i) begin[i + 1] = begin[i] + count;
  return begin;
}

template <typename T>
void Combine(T* into, const T* from, int64_t count, ReduceOp op) {
  if (op == ReduceOp::kMax) {
    for (int64_t i = 0; i < count; ++i) into[i] = std::max(into[i], from[i]);
  } else {
    for (int64_t i = 0; i < count; ++i) into[i] += from[i];
  }
}

template <typename T>
void Divide(T* data, int64_t count, int n) {
  const T d = static_cast<T>(n);
  for (int64_t i = 0; i < count; ++i) data[i] /= d;
}

void CombineBytes(void* into, const void* from, int64_t count, DataType dtype, ReduceOp op) {
  if (dtype == DataType::kFloat32) {
    Combine(static_cast<float*>(into), static_cast<const float*>(from), count, op);
  } else {
    Combine(static_cast<double*>(into), static_cast<const double*>(from), count, op);
  }
}

void DivideBytes(void* data, int64_t count, DataType dtype, int n) {
  if (dtype == DataType::kFloat32) {
    Divide(static_cast<float*>(data), count, n);
  } else {
    Divide(static_cast<double*>(data), count, n);
  }
}

class RingCollectives final : public Collectives {
 public:
  explicit RingCollectives(std::unique_ptr<Transport> transport)
      : transport_(std::move(transport)),
        backend_(absl::StrCat("ring over ", transport_->backend())) {}

  int rank() const override { return transport_->rank(); }
  int size() const override { return transport_->world_size(); }
  absl::string_view backend() const override { return backend_; }
  bool takes_device_memory() const override { return false; }

  absl::Status AllReduce(void* data, int64_t count, DataType dtype, ReduceOp op,
                         absl::Duration timeout) override {
    Call call = Begin("all-reduce", timeout);
    RETURN_IF_ERROR(CheckCall(call.what, count, data, data, -1, size()));
    RETURN_IF_ERROR(Usable(call));
    const std::vector<int64_t> chunks = ChunkOffsets(count, size());
    char* bytes = static_cast<char*>(data);
    RETURN_IF_ERROR(RingReduceScatter(call, bytes, chunks, dtype, op));
    return RingAllGather(call, bytes, chunks, dtype);
  }

  absl::Status ReduceScatter(const void* input, void* output, int64_t count, DataType dtype,
                             ReduceOp op, absl::Duration timeout) override {
    Call call = Begin("reduce-scatter", timeout);
    RETURN_IF_ERROR(CheckCall(call.what, count, input, output, -1, size()));
    RETURN_IF_ERROR(Usable(call));
    const size_t elt = ElementBytes(dtype);
    const std::vector<int64_t> blocks = BlockOffsets(count, size());
    work_.resize(static_cast<size_t>(blocks.back()) * elt);
    if (!work_.empty()) std::memcpy(work_.data(), input, work_.size());
    RETURN_IF_ERROR(RingReduceScatter(call, work_.data(), blocks, dtype, op));
    if (count > 0) std::memcpy(output, work_.data() + blocks[rank()] * elt, count * elt);
    return absl::OkStatus();
  }

  absl::Status AllGather(const void* input, void* output, int64_t count, DataType dtype,
                         absl::Duration timeout) override {
    Call call = Begin("all-gather", timeout);
    RETURN_IF_ERROR(CheckCall(call.what, count, input, output, -1, size()));
    RETURN_IF_ERROR(Usable(call));
    const size_t elt = ElementBytes(dtype);
    const std::vector<int64_t> blocks = BlockOffsets(count, size());
    char* out = static_cast<char*>(output);
    char* own = out + blocks[rank()] * elt;
    if (count > 0 && own != input) std::memmove(own, input, count * elt);
    return RingAllGather(call, out, blocks, dtype);
  }

  absl::Status Broadcast(void* data, int64_t count, DataType dtype, int root,
                         absl::Duration timeout) override {
    Call call = Begin("broadcast", timeout);
    RETURN_IF_ERROR(CheckCall(call.what, count, data, data, root, size()));
    RETURN_IF_ERROR(Usable(call));
    const size_t bytes = static_cast<size_t>(count) * ElementBytes(dtype);
    if (bytes == 0 || size() == 1) return absl::OkStatus();
    if (rank() != root) {
      return Exchange(call, 0, nullptr, 0, -1, data, bytes, root, "receive from the root");
    }
    std::vector<std::unique_ptr<Work>> sends;
    for (int peer = 0; peer < size(); ++peer) {
      if (peer == root) continue;
      auto posted = transport_->Send(data, bytes, peer, Tag(call, 0));
      if (!posted.ok()) return Fail(call, posted.status(), peer, "send to a rank");
      sends.push_back(*std::move(posted));
    }
    int i = 0;
    for (int peer = 0; peer < size(); ++peer) {
      if (peer == root) continue;
      absl::Status sent = sends[i++]->Wait(Remaining(call));
      if (!sent.ok()) return Fail(call, sent, peer, "send to a rank");
    }
    return absl::OkStatus();
  }

  void Abort() override {
    aborted_.store(true);
    transport_->Abort();
  }

  CollectiveStats stats() const override {
    const transport::TransferStats t = transport_->stats();
    return CollectiveStats{t.bytes_sent, t.bytes_received};
  }

 private:
  struct Call {
    const char* what;
    uint64_t seq;
    absl::Time deadline;
    absl::Duration timeout;
  };

  // The call's sequence number is taken only once its checks passed (Usable), so a refused call
  // moves no rank's count.
  static Call Begin(const char* what, absl::Duration timeout) {
    return Call{what, 0, absl::Now() + timeout, timeout};
  }

  absl::Status Usable(Call& call) {
    if (aborted_.load()) {
      return absl::CancelledError(absl::StrCat(call.what, ": the collectives were aborted"));
    }
    if (failed_) {
      return absl::FailedPreconditionError(
          absl::StrCat(call.what, ": an earlier collective failed on this group"));
    }
    call.seq = ++seq_;
    return absl::OkStatus();
  }

  static absl::Duration Remaining(const Call& call) {
    return std::max(call.deadline - absl::Now(), absl::ZeroDuration());
  }

  // Tag of ring step `step` of `call`: one call's messages never pair with another's.
  static uint64_t Tag(const Call& call, int step) {
    return (call.seq << 20) | static_cast<uint64_t>(step & 0xfffff);
  }

  // Marks the group failed and aborts its transport (a posted transfer may still point into a
  // buffer the caller will free); the error names the call, this rank and the peer.
  absl::Status Fail(const Call& call, const absl::Status& status, int peer, const char* doing) {
    failed_ = true;
    transport_->Abort();
    return absl::Status(
        status.code(), absl::StrCat(call.what, " (rank ", rank(), " of ", size(), "): ", doing, " ",
                                    peer, ": ", status.message()));
  }

  // One ring step: sends `send_bytes` at `send` to `to` and receives `recv_bytes` into `recv`
  // from `from` (a side with 0 bytes is skipped; both ranks know the sizes).
  absl::Status Exchange(const Call& call, int step, const void* send, size_t send_bytes, int to,
                        void* recv, size_t recv_bytes, int from, const char* doing) {
    std::unique_ptr<Work> recv_work, send_work;
    if (recv_bytes > 0) {
      auto posted = transport_->Recv(recv, recv_bytes, from, Tag(call, step));
      if (!posted.ok()) return Fail(call, posted.status(), from, doing);
      recv_work = *std::move(posted);
    }
    if (send_bytes > 0) {
      auto posted = transport_->Send(send, send_bytes, to, Tag(call, step));
      if (!posted.ok()) return Fail(call, posted.status(), to, doing);
      send_work = *std::move(posted);
    }
    if (recv_work != nullptr) {
      absl::Status got = recv_work->Wait(Remaining(call));
      if (!got.ok()) {
        return Fail(call, got, from, absl::IsDeadlineExceeded(got) ? "waiting for rank" : doing);
      }
    }
    if (send_work != nullptr) {
      absl::Status sent = send_work->Wait(Remaining(call));
      if (!sent.ok()) return Fail(call, sent, to, "send to rank");
    }
    return absl::OkStatus();
  }



  // After n-1 steps rank r holds chunk r reduced over the group (divided by n for kMean).
  absl::Status RingReduceScatter(const Call& call, char* buf, const std::vector<int64_t>& chunks,
                                 DataType dtype, ReduceOp op) {
    const int n = size(), r = rank();
    const size_t elt = ElementBytes(dtype);
    const int next = Mod(r + 1, n), prev = Mod(r - 1, n);
    std::vector<char>& incoming = incoming_;
    for (int k = 0; k + 1 < n; ++k) {
      const int send_c = Mod(r - k - 1, n), recv_c = Mod(r - k - 2, n);
      const int64_t send_count = chunks[send_c + 1] - chunks[send_c];
      const int64_t recv_count = chunks[recv_c + 1] - chunks[recv_c];
      incoming.resize(recv_count * elt);
      RETURN_IF_ERROR(Exchange(call, k, buf + chunks[send_c] * elt, send_count * elt, next,
                               incoming.data(), recv_count * elt, prev, "receive from rank"));
      CombineBytes(buf + chunks[recv_c] * elt, incoming.data(), recv_count, dtype, op);
    }
    if (op == ReduceOp::kMean && n > 1) {
      DivideBytes(buf + chunks[r] * elt, chunks[r + 1] - chunks[r], dtype, n);
    }
    return absl::OkStatus();
  }

  // Each rank starts with its own chunk r; after n-1 steps every rank holds every chunk.
  absl::Status RingAllGather(const Call& call, char* buf, const std::vector<int64_t>& chunks,
                             DataType dtype) {
    const int n = size(), r = rank();
    const size_t elt = ElementBytes(dtype);
    const int next = Mod(r + 1, n), prev = Mod(r - 1, n);
    for (int k = 0; k + 1 < n; ++k) {
      const int send_c = Mod(r - k, n), recv_c = Mod(r - k - 1, n);
      RETURN_IF_ERROR(
          Exchange(call, n + k, buf + chunks[send_c] * elt,
                   (chunks[send_c + 1] - chunks[send_c]) * elt, next, buf + chunks[recv_c] * elt,
                   (chunks[recv_c + 1] - chunks[recv_c]) * elt, prev, "receive from rank"));
    }
    return absl::OkStatus();
  }

  const std::unique_ptr<Transport> transport_;
  const std::string backend_;
  std::atomic<bool> aborted_{false};
  bool failed_ = false;
  uint64_t seq_ = 0;
  // Scratch kept across calls: a buffer of tens of MiB allocated anew each call is mapped fresh
  // by malloc (above its mmap threshold) and page-faulted in as data arrives, which cost up to
  // 10x the transfer itself (bench/data_parallel_bench, 64 MiB).
  std::vector<char> incoming_;  // a ring step's received chunk
  std::vector<char> work_;      // ReduceScatter's copy of its input
};

}  // namespace

absl::StatusOr<std::unique_ptr<Collectives>> CreateRingCollectives(
    std::unique_ptr<Transport> transport) {
  if (transport == nullptr) {
    return absl::InvalidArgumentError("CreateRingCollectives: no transport");
  }
  if (transport->capabilities().takes_device_memory) {
    return absl::InvalidArgumentError(
        absl::StrCat("CreateRingCollectives: transport ", transport->backend(),
                     " takes device memory; ring collectives reduce in host memory"));
  }
  return std::unique_ptr<Collectives>(new RingCollectives(std::move(transport)));
}

}  // namespace stagecoach::collectives
