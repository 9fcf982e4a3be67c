// Adapter code the backends share (gloo/, nccl/): the Transport and Work classes over a
// backend's endpoint, transfer counters, and labels and errors in one wording. For backend
// implementations only; callers include transport.h and a backend's factory.h.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/transport/backends.h"
#include "worker/transport/transport.h"

namespace stagecoach::transport::adapter {

// "0x2a".
std::string Hex(uint64_t value);

// "rank 1: receive from rank 0 (tag 0x7, 64 bytes)"; `what` is "send to" or "receive from".
std::string TransferLabel(int rank, absl::string_view what, int peer, uint64_t tag, size_t bytes);

// CANCELLED "<what> cancelled: the transport was destroyed" when `destroyed`, else "... was
// aborted".
absl::Status Cancelled(absl::string_view what, bool destroyed);

// DEADLINE_EXCEEDED "<what> timed out after <timeout> (<hint>)".
absl::Status TimedOut(absl::string_view what, absl::Duration timeout, absl::string_view hint);

// Bytes of the transfers a Wait saw complete. Thread-safe.
class TransferCounters {
 public:
  void CountSent(size_t bytes) { sent_ += static_cast<int64_t>(bytes); }
  void CountReceived(size_t bytes) { received_ += static_cast<int64_t>(bytes); }
  TransferStats stats() const {
    TransferStats stats;
    stats.bytes_sent = sent_.load();
    stats.bytes_received = received_.load();
    return stats;
  }

 private:
  std::atomic<int64_t> sent_{0};
  std::atomic<int64_t> received_{0};
};

// A posted transfer, waited for through its endpoint. Holds the endpoint, so Works may outlive
// their transport (the endpoint's Wait then returns CANCELLED).
template <typename Endpoint, typename Op>
class EndpointWork final : public Work {
 public:
  EndpointWork(std::shared_ptr<Endpoint> endpoint, std::shared_ptr<Op> op)
      : endpoint_(std::move(endpoint)), op_(std::move(op)) {}

  absl::Status Wait(absl::Duration timeout) override { return endpoint_->Wait(*op_, timeout); }
  bool Done() override { return endpoint_->Done(*op_); }

 private:
  const std::shared_ptr<Endpoint> endpoint_;
  const std::shared_ptr<Op> op_;
};

// A Transport over a backend's endpoint, naming the backend and its capabilities from its
// descriptor. The endpoint is thread-safe and provides:
//   int rank() const;  int size() const;  TransferStats stats() const;
//   absl::StatusOr<std::shared_ptr<Op>> Send(const void* data, size_t bytes, int peer,
//                                            uint64_t tag);   // and Recv(void* data, ...)
//   absl::Status Wait(Op& op, absl::Duration timeout);
//   bool Done(Op& op);  // Wait would return at once; never blocks (a const Op& will do)
//   absl::Status Barrier(absl::Duration timeout);
//   void Abort();
//   void Shutdown();  // Called once, by the transport's destructor.
template <typename Endpoint, typename = void>
inline constexpr bool kHasRecvUpTo = false;
template <typename Endpoint>
inline constexpr bool kHasRecvUpTo<
    Endpoint,
    std::void_t<decltype(std::declval<Endpoint&>().RecvUpTo(nullptr, size_t{0}, 0, uint64_t{0}))>> =
    true;

template <typename Endpoint, typename Op>
class EndpointTransport final : public Transport {
 public:
  EndpointTransport(const BackendDescriptor& backend, std::shared_ptr<Endpoint> endpoint)
      : backend_(backend), endpoint_(std::move(endpoint)) {}
  ~EndpointTransport() override { endpoint_->Shutdown(); }

  int rank() const override { return endpoint_->rank(); }
  int world_size() const override { return endpoint_->size(); }
  absl::string_view backend() const override { return backend_.name; }
  const BackendCapabilities& capabilities() const override { return backend_.capabilities; }

  absl::StatusOr<std::unique_ptr<Work>> Send(const void* data, size_t bytes, int peer,
                                             uint64_t tag) override {
    return Wrap(endpoint_->Send(data, bytes, peer, tag));
  }

  absl::StatusOr<std::unique_ptr<Work>> Recv(void* data, size_t bytes, int peer,
                                             uint64_t tag) override {
    return Wrap(endpoint_->Recv(data, bytes, peer, tag));
  }

  // An endpoint that has RecvUpTo(data, max_bytes, peer, tag) offers it (its descriptor says
  // shorter_receives); the others keep Transport's UNIMPLEMENTED.
  absl::StatusOr<std::unique_ptr<Work>> RecvUpTo(void* data, size_t max_bytes, int peer,
                                                 uint64_t tag) override {
    if constexpr (kHasRecvUpTo<Endpoint>) {
      return Wrap(endpoint_->RecvUpTo(data, max_bytes, peer, tag));
    } else {
      return Transport::RecvUpTo(data, max_bytes, peer, tag);
    }
  }

  absl::Status Barrier(absl::Duration timeout) override { return endpoint_->Barrier(timeout); }
  void Abort() override { endpoint_->Abort(); }
  TransferStats stats() const override { return endpoint_->stats(); }

 private:
  absl::StatusOr<std::unique_ptr<Work>> Wrap(absl::StatusOr<std::shared_ptr<Op>> op) {
    if (!op.ok()) return op.status();
    return std::unique_ptr<Work>(new EndpointWork<Endpoint, Op>(endpoint_, *std::move(op)));
  }

  const BackendDescriptor backend_;
  const std::shared_ptr<Endpoint> endpoint_;
};

}  // namespace stagecoach::transport::adapter
