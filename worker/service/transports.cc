#include "worker/service/transports.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/runtime/message_tags.h"
#include "worker/transport/gloo/factory.h"
#include "worker/transport/nccl/factory.h"

namespace stagecoach::worker {

std::vector<std::string> AvailableTransports(const TransportConfig& config) {
  std::vector<std::string> out = {"gloo"};
  if (config.cuda_device >= 0 && transport::NcclAvailable()) out.push_back("nccl");
  return out;
}

runtime::TransportFactory MakeTransportFactory(TransportConfig config) {
  return [config](const runtime::TransportRequest& request, transport::RendezvousStore* store)
             -> absl::StatusOr<std::unique_ptr<transport::Transport>> {
    const std::vector<std::string> offered = AvailableTransports(config);
    if (std::find(offered.begin(), offered.end(), request.backend) == offered.end()) {
      return absl::InvalidArgumentError(absl::StrCat("transport: this worker offers ",
                                                     absl::StrJoin(offered, ", "), ", not '",
                                                     request.backend, "'"));
    }
    if (request.backend == "nccl") {
      transport::NcclOptions options;
      options.rank = request.rank;
      options.world_size = request.world_size;
      options.cuda_device = config.cuda_device;
      options.key_prefix = absl::StrCat(request.prefix, "nccl/");
      options.connect_timeout = request.timeout;
      options.link_shift = runtime::kLinkShift;
      for (const runtime::Link& link :
           runtime::LinksOfRank(request.stage_to_rank, request.rank, request.forward_only,
                                 request.skips)) {
        options.links.push_back(transport::NcclLink{link.link, link.peer});
      }
      return transport::CreateNcclTransport(options, store);
    }
    transport::GlooOptions options;
    options.rank = request.rank;
    options.world_size = request.world_size;
    options.hostname = config.data_host;
    options.key_prefix = request.prefix;
    options.connect_timeout = request.timeout;
    return transport::CreateGlooTransport(options, store);
  };
}

}  // namespace stagecoach::worker
