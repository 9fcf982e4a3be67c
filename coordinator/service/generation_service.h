// The gRPC adapter of GenerationService (generation.proto): checks the request's job id and
// timeout, runs Generation::Generate and streams its messages. Served beside
// CoordinatorService on the coordinator's address, behind the same call check (its one method
// needs the client token).
#pragma once

#include "absl/time/time.h"
#include "coordinator/generation/generation.h"
#include "stagecoach/v1/generation.grpc.pb.h"

namespace stagecoach::coordinator {

class GenerationServiceImpl final : public v1::GenerationService::Service {
 public:
  static constexpr absl::Duration kDefaultTimeout = absl::Minutes(10);
  static constexpr absl::Duration kMaxTimeout = absl::Hours(1);

  // `generation` must outlive the service.
  explicit GenerationServiceImpl(Generation* generation) : generation_(generation) {}

  grpc::Status Generate(grpc::ServerContext* ctx, const v1::GenerateRequest* req,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override;

 private:
  Generation* const generation_;
};

}  // namespace stagecoach::coordinator
