// A transport that hands every call to another one (real Gloo in the tests), for test transports
// that change one behaviour and keep the rest: override what differs.
#pragma once

#include <memory>
#include <utility>

#include "worker/transport/transport.h"

namespace stagecoach::testing {

class ForwardingTransport : public transport::Transport {
 public:
  explicit ForwardingTransport(std::unique_ptr<transport::Transport> inner)
      : owned_(std::move(inner)), inner_(owned_.get()) {}
  // Not owning: `inner` must outlive this transport (a benchmark's executors sharing one).
  explicit ForwardingTransport(transport::Transport* inner) : inner_(inner) {}

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  absl::string_view backend() const override { return inner_->backend(); }
  const transport::BackendCapabilities& capabilities() const override {
    return inner_->capabilities();
  }
  absl::StatusOr<std::unique_ptr<transport::Work>> Send(const void* data, size_t bytes, int peer,
                                                        uint64_t tag) override {
    return inner_->Send(data, bytes, peer, tag);
  }
  absl::StatusOr<std::unique_ptr<transport::Work>> Recv(void* data, size_t bytes, int peer,
                                                        uint64_t tag) override {
    return inner_->Recv(data, bytes, peer, tag);
  }
  absl::StatusOr<std::unique_ptr<transport::Work>> RecvUpTo(void* data, size_t max_bytes, int peer,
                                                            uint64_t tag) override {
    return inner_->RecvUpTo(data, max_bytes, peer, tag);
  }
  absl::Status Barrier(absl::Duration timeout) override { return inner_->Barrier(timeout); }
  void Abort() override { inner_->Abort(); }
  transport::TransferStats stats() const override { return inner_->stats(); }

 protected:
  transport::Transport& inner() { return *inner_; }

 private:
  std::unique_ptr<transport::Transport> owned_;
  transport::Transport* inner_;
};

}  // namespace stagecoach::testing
