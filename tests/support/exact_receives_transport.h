// A transport as one that takes only exact receives (NCCL's kind) sees it: every call goes to
// the wrapped transport (real Gloo in the tests), but capabilities() says no shorter receives and
// RecvUpTo is UNIMPLEMENTED, so the pipeline executor sends a ragged activation's shape header
// ahead of it rather than framed with it (worker/runtime/executor/shape_header.h). For tests and
// benchmarks of that path on a machine without NCCL.
#pragma once

#include <memory>
#include <utility>

#include "tests/support/forwarding_transport.h"

namespace stagecoach::testing {

class ExactReceivesTransport final : public ForwardingTransport {
 public:
  template <typename Inner>
  explicit ExactReceivesTransport(Inner&& inner)
      : ForwardingTransport(std::forward<Inner>(inner)),
        capabilities_(ForwardingTransport::capabilities()) {
    capabilities_.shorter_receives = false;
  }

  const transport::BackendCapabilities& capabilities() const override { return capabilities_; }
  absl::StatusOr<std::unique_ptr<transport::Work>> RecvUpTo(void* data, size_t max_bytes, int peer,
                                                            uint64_t tag) override {
    return Transport::RecvUpTo(data, max_bytes, peer, tag);  // UNIMPLEMENTED
  }

 private:
  transport::BackendCapabilities capabilities_;
};

}  // namespace stagecoach::testing
