#include "worker/service/transports.h"

#include <utility>

#include "common/util/status_macros.h"
#include "worker/collectives/nccl/factory.h"
#include "worker/collectives/ring/factory.h"
#include "worker/runtime/executor/message_tags.h"

namespace stagecoach::worker {
namespace {

const transport::TransportRegistry& RegistryOf(const TransportConfig& config) {
  return config.registry != nullptr ? *config.registry : transport::TransportRegistry::Global();
}

// What a factory connects: `rank` of `world_size` under `prefix` on this worker's host and device.
transport::ConnectRequest ConnectRequestOf(const TransportConfig& config, int rank, int world_size,
                                           const std::string& prefix, absl::Duration timeout) {
  transport::ConnectRequest connect;
  connect.options.rank = rank;
  connect.options.world_size = world_size;
  connect.options.key_prefix = prefix;
  connect.options.connect_timeout = timeout;
  connect.hostname = config.data_host;
  connect.cuda_device = config.cuda_device;
  return connect;
}

}  // namespace

std::vector<std::string> AvailableTransports(const TransportConfig& config) {
  return RegistryOf(config).Offered(config.cuda_device);
}

runtime::TransportFactory MakeTransportFactory(TransportConfig config) {
  return [config](const runtime::TransportRequest& request, transport::RendezvousStore* store)
             -> absl::StatusOr<std::unique_ptr<transport::Transport>> {
    const transport::TransportRegistry& registry = RegistryOf(config);
    ASSIGN_OR_RETURN(const transport::BackendDescriptor backend,
                     registry.FindOffered(request.backend, config.cuda_device));
    transport::ConnectRequest connect = ConnectRequestOf(config, request.rank, request.world_size,
                                                         request.prefix, request.timeout);
    connect.link_shift = runtime::kLinkShift;
    if (!backend.capabilities.matches_tags) {
      for (const runtime::Link& link :
           runtime::LinksOfRank(request.stage_to_rank, request.rank, request.forward_only,
                                request.skips, request.tied_ends)) {
        connect.links.push_back(transport::Link{link.link, link.peer});
      }
    }
    return registry.Create(backend.name, connect, store);
  };
}

runtime::CollectivesFactory MakeCollectivesFactory(TransportConfig config) {
  return [config](const runtime::CollectivesRequest& request, transport::RendezvousStore* store)
             -> absl::StatusOr<std::unique_ptr<collectives::Collectives>> {
    const transport::TransportRegistry& registry = RegistryOf(config);
    ASSIGN_OR_RETURN(const transport::BackendDescriptor backend,
                     registry.FindOffered(request.backend, config.cuda_device));
    if (backend.capabilities.takes_device_memory) {
      collectives::NcclCollectivesOptions options;
      options.rank = request.rank;
      options.world_size = request.size;
      options.key_prefix = request.prefix;
      options.connect_timeout = request.timeout;
      options.cuda_device = config.cuda_device;
      return collectives::CreateNcclCollectives(options, store);
    }
    const transport::ConnectRequest connect =
        ConnectRequestOf(config, request.rank, request.size, request.prefix, request.timeout);
    ASSIGN_OR_RETURN(std::unique_ptr<transport::Transport> t,
                     registry.Create(backend.name, connect, store));
    return collectives::CreateRingCollectives(std::move(t));
  };
}

}  // namespace stagecoach::worker
