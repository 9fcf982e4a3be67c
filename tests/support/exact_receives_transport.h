// A transport as one that takes only exact receives (NCCL's kind) sees it: every call goes to
// the wrapped transport (real Gloo in the tests), but capabilities() says no shorter receives and
// RecvUpTo is UNIMPLEMENTED, so the pipeline executor sends a ragged activation's shape header
// ahead of it rather than framed with it (worker/runtime/executor/shape_header.h). For tests and
// benchmarks of that path on a machine without NCCL.
#pragma once

#include <memory>
#include <utility>

#include "worker/transport/transport.h"

namespace stagecoach::testing {

class ExactReceivesTransport final : public transport::Transport {
 public:
  explicit ExactReceivesTransport(std::unique_ptr<transport::Transport> inner)
      : owned_(std::move(inner)), inner_(owned_.get()), capabilities_(inner_->capabilities()) {
    capabilities_.shorter_receives = false;
  }
  // Not owning: `inner` must outlive this transport (a benchmark's executors sharing one).
  explicit ExactReceivesTransport(transport::Transport* inner)
      : inner_(inner), capabilities_(inner_->capabilities()) {
    capabilities_.shorter_receives = false;
  }

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  absl::string_view backend() const override { return inner_->backend(); }
  const transport::BackendCapabilities& capabilities() const override { return capabilities_; }
  absl::StatusOr<std::unique_ptr<transport::Work>> Send(const void* data, size_t bytes, int peer,
                                                        uint64_t tag) override {
    return inner_->Send(data, bytes, peer, tag);
  }
  absl::StatusOr<std::unique_ptr<transport::Work>> Recv(void* data, size_t bytes, int peer,
                                                        uint64_t tag) override {
    return inner_->Recv(data, bytes, peer, tag);
  }
  absl::Status Barrier(absl::Duration timeout) override { return inner_->Barrier(timeout); }
  void Abort() override { inner_->Abort(); }
  transport::TransferStats stats() const override { return inner_->stats(); }

 private:
  std::unique_ptr<transport::Transport> owned_;
  transport::Transport* inner_;
  transport::BackendCapabilities capabilities_;
};

}  // namespace stagecoach::testing
