// Transports chosen by capability: the backend registry's contract (common/transport), the
// worker's registry of factories (worker/transport/registry.h) and its service's use of it, and
// fake backends, registered with capabilities only, that the planner, the spec parser, the
// worker registry and the executor pick or serve by those capabilities (nothing under test
// knows the fakes' names).
#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/spec/spec_parser.h"
#include "common/transport/backends.h"
#include "coordinator/planning/planner.h"
#include "coordinator/workers/worker_registry.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/model/stage_model.h"
#include "worker/runtime/executor/message_tags.h"
#include "worker/runtime/executor/pipeline_executor.h"
#include "worker/service/transports.h"
#include "worker/transport/in_memory_store.h"
#include "worker/transport/nccl/factory.h"
#include "worker/transport/registry.h"
#include "worker/transport/transport.h"

namespace stagecoach::transport::transport_registry_test {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

BackendDescriptor HostBackend(std::string name, int preference = 0) {
  BackendDescriptor d;
  d.name = std::move(name);
  d.auto_preference = preference;
  return d;
}

// Device memory, transfers ordered per link, CUDA only: what NCCL is, under another name.
BackendDescriptor DeviceBackend(std::string name, int preference = 0) {
  BackendDescriptor d;
  d.name = std::move(name);
  d.capabilities.takes_device_memory = true;
  d.capabilities.matches_tags = false;
  d.capabilities.needs_cuda = true;
  d.auto_preference = preference;
  return d;
}

// Registers a fake backend in BackendRegistry::Global() for the scope of a test.
class ScopedBackend {
 public:
  explicit ScopedBackend(BackendDescriptor descriptor) : name_(descriptor.name) {
    registered_ = BackendRegistry::Global().Register(std::move(descriptor));
    EXPECT_TRUE(registered_.ok()) << registered_;
  }
  ~ScopedBackend() {
    if (registered_.ok()) {
      EXPECT_TRUE(BackendRegistry::Global().Unregister(name_).ok());
    }
  }
  ScopedBackend(const ScopedBackend&) = delete;
  ScopedBackend& operator=(const ScopedBackend&) = delete;

 private:
  const std::string name_;
  absl::Status registered_;
};

// ---------------------------------------------------------------------------------------------
// BackendRegistry.

TEST(BackendRegistry, GlobalHoldsTheBuiltInBackends) {
  const BackendRegistry& global = BackendRegistry::Global();
  EXPECT_THAT(global.Names(), ElementsAre(GlooDescriptor().name, NcclDescriptor().name));
  const BackendCapabilities gloo = global.Find(GlooDescriptor().name)->capabilities;
  EXPECT_FALSE(gloo.takes_device_memory);
  EXPECT_TRUE(gloo.matches_tags);
  EXPECT_TRUE(gloo.detects_size_mismatch);
  EXPECT_TRUE(gloo.on_every_worker);
  EXPECT_FALSE(gloo.needs_cuda);
  const BackendCapabilities nccl = global.Find(NcclDescriptor().name)->capabilities;
  EXPECT_TRUE(nccl.takes_device_memory);
  EXPECT_FALSE(nccl.matches_tags);
  EXPECT_FALSE(nccl.independent_transfers);
  EXPECT_TRUE(nccl.needs_cuda);
  EXPECT_FALSE(nccl.on_every_worker);
}

TEST(BackendRegistry, UnknownNamesAreNotFoundNamingTheRegisteredOnes) {
  BackendRegistry registry;
  EXPECT_THAT(registry.Names(), IsEmpty());
  ASSERT_TRUE(registry.Register(HostBackend("tcp")).ok());
  ASSERT_TRUE(registry.Register(DeviceBackend("rdma")).ok());
  EXPECT_THAT(registry.Names(), ElementsAre("rdma", "tcp"));
  const absl::Status missing = registry.Find("mpi").status();
  EXPECT_TRUE(absl::IsNotFound(missing));
  EXPECT_EQ(missing.message(), "no transport backend 'mpi' (registered: rdma, tcp)");
  EXPECT_TRUE(absl::IsNotFound(registry.Unregister("mpi")));
  ASSERT_TRUE(registry.Unregister("tcp").ok());
  EXPECT_TRUE(absl::IsNotFound(registry.Find("tcp").status()));
  EXPECT_THAT(registry.Names(), ElementsAre("rdma"));
}

TEST(BackendRegistry, RefusesDuplicatesBadNamesAndContradictions) {
  BackendRegistry registry;
  ASSERT_TRUE(registry.Register(HostBackend("tcp")).ok());
  const absl::Status again = registry.Register(DeviceBackend("tcp"));
  EXPECT_TRUE(absl::IsAlreadyExists(again));
  EXPECT_THAT(std::string(again.message()), HasSubstr("tcp is already registered"));
  EXPECT_FALSE(registry.Find("tcp")->capabilities.takes_device_memory);  // the first one stays
  for (const char* bad : {"", "auto", "Tcp", "my tcp", "tcp/2"}) {
    EXPECT_TRUE(absl::IsInvalidArgument(registry.Register(HostBackend(bad)))) << bad;
  }
  BackendDescriptor device_without_cuda = DeviceBackend("gpu-direct");
  device_without_cuda.capabilities.needs_cuda = false;
  EXPECT_THAT(std::string(registry.Register(device_without_cuda).message()),
              HasSubstr("takes device memory, so it needs CUDA"));
  BackendDescriptor cuda_everywhere = DeviceBackend("everywhere");
  cuda_everywhere.capabilities.on_every_worker = true;
  EXPECT_THAT(std::string(registry.Register(cuda_everywhere).message()),
              HasSubstr("needs CUDA, so not every worker has it"));
  EXPECT_THAT(registry.Names(), ElementsAre("tcp"));
}

TEST(BackendRegistry, DefaultsByDeviceMemoryThenPreferenceThenName) {
  BackendRegistry registry;
  EXPECT_TRUE(absl::IsNotFound(registry.DefaultFor("cpu").status()));
  ASSERT_TRUE(registry.Register(DeviceBackend("rdma")).ok());
  // A CUDA-only backend never serves cpu.
  EXPECT_TRUE(absl::IsNotFound(registry.DefaultFor("cpu").status()));
  EXPECT_EQ(registry.DefaultFor("cuda")->name, "rdma");
  ASSERT_TRUE(registry.Register(HostBackend("tcp", /*preference=*/5)).ok());
  // On cuda, device memory beats host memory whatever the preference; on cpu the reverse.
  EXPECT_EQ(registry.DefaultFor("cuda")->name, "rdma");
  EXPECT_EQ(registry.DefaultFor("cpu")->name, "tcp");
  // Among equals the higher preference, then the first name.
  ASSERT_TRUE(registry.Register(HostBackend("shm", /*preference=*/9)).ok());
  EXPECT_EQ(registry.DefaultFor("cpu")->name, "shm");
  ASSERT_TRUE(registry.Register(HostBackend("ipc", /*preference=*/9)).ok());
  EXPECT_EQ(registry.DefaultFor("cpu")->name, "ipc");
  ASSERT_TRUE(registry.Unregister("rdma").ok());
  EXPECT_EQ(registry.DefaultFor("cuda")->name, "ipc");  // host-staged
}

TEST(BackendRegistry, ResolvesAndChecksAPlacement) {
  BackendRegistry registry;
  ASSERT_TRUE(registry.Register(HostBackend("tcp")).ok());
  ASSERT_TRUE(registry.Register(DeviceBackend("rdma")).ok());
  EXPECT_EQ(*registry.Resolve("auto", "cpu"), "tcp");
  EXPECT_EQ(*registry.Resolve("", "cuda"), "rdma");
  EXPECT_EQ(*registry.Resolve("tcp", "cuda"), "tcp");
  EXPECT_EQ(*registry.Resolve("rdma", "cuda"), "rdma");
  EXPECT_EQ(registry.Resolve("mpi", "cpu").status().message(),
            "must be one of auto, rdma, tcp, got 'mpi'");
  const absl::Status on_cpu = registry.Resolve("rdma", "cpu").status();
  EXPECT_TRUE(absl::IsInvalidArgument(on_cpu));
  EXPECT_EQ(on_cpu.message(), "rdma needs placement.device cuda (device is cpu; use tcp or auto)");
  EXPECT_EQ(registry.CheckDevice("rdma", "cpu"), on_cpu);
  EXPECT_TRUE(registry.CheckDevice("auto", "cpu").ok());
  EXPECT_TRUE(registry.CheckDevice("mpi", "cpu").ok());  // Resolve reports unknown names
  EXPECT_TRUE(registry.CheckDevice("rdma", "cuda").ok());
}

// ---------------------------------------------------------------------------------------------
// The coordinator's choices, with a fake backend in the global registry.

spec::JobSpec TwoStageSpec(const std::string& placement) {
  auto spec = spec::ParseJobSpec(
      absl::StrCat("name: t\nmodel: {builtin: {family: mlp, sizes: [4, 8, 8, 2]}}\n",
                   "split: {stages: 2}\nschedule: {kind: 1F1B, microbatches: 2}\n",
                   "placement: {workers: 2", placement, "}\ntraining: {batch_size: 8}\n"),
      "t");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : spec::JobSpec();
}

TEST(TransportByCapability, PlannerPicksAFakeDeviceMemoryBackendForCuda) {
  ScopedBackend fake(DeviceBackend("fake-device", /*preference=*/1));
  auto cuda = coordinator::PlanJob(TwoStageSpec(", device: cuda"));
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  EXPECT_EQ(cuda->transport, "fake-device");
  // cpu placements get the host-memory backend; the fake needs CUDA.
  auto cpu = coordinator::PlanJob(TwoStageSpec(""));
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(cpu->transport, GlooDescriptor().name);

  spec::JobSpec explicit_cpu = TwoStageSpec("");
  explicit_cpu.placement.transport = "fake-device";
  EXPECT_EQ(coordinator::PlanJob(explicit_cpu).status().message(),
            "placement.transport: fake-device needs placement.device cuda (device is cpu; use "
            "gloo or auto)");
  spec::JobSpec unknown = TwoStageSpec("");
  unknown.placement.transport = "mpi";
  EXPECT_EQ(coordinator::PlanJob(unknown).status().message(),
            "placement.transport: must be one of auto, fake-device, gloo, nccl, got 'mpi'");
}

TEST(TransportByCapability, SpecParserAcceptsAndChecksARegisteredFake) {
  ScopedBackend fake(DeviceBackend("fake-device"));
  EXPECT_EQ(TwoStageSpec(", device: cuda, transport: fake-device").placement.transport,
            "fake-device");
  auto on_cpu = spec::ParseJobSpec(
      "name: t\nmodel: {builtin: {family: mlp, sizes: [4, 8, 2]}}\nschedule: {kind: 1F1B}\n"
      "placement: {transport: fake-device}\ntraining: {batch_size: 8}\n",
      "t");
  ASSERT_FALSE(on_cpu.ok());
  EXPECT_THAT(std::string(on_cpu.status().message()),
              HasSubstr("placement.transport: fake-device needs placement.device cuda (device is "
                        "cpu; use gloo or auto)"));
}

TEST(TransportByCapability, WorkersWithoutTransportsOfferWhatEveryWorkerHas) {
  BackendDescriptor everywhere = HostBackend("fake-everywhere");
  everywhere.capabilities.on_every_worker = true;
  ScopedBackend fake_everywhere(everywhere);
  ScopedBackend fake_host(HostBackend("fake-host"));
  coordinator::WorkerRegistry registry(absl::Seconds(3));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  auto silent = registry.Register("a", "h:1", "cpu", {}, t0);
  auto listed = registry.Register("b", "h:2", "cpu", {"fake-host"}, t0);
  ASSERT_TRUE(silent.ok() && listed.ok());
  ASSERT_EQ(registry.Idle("cpu", "fake-everywhere").size(), 1u);
  EXPECT_EQ(registry.Idle("cpu", "fake-everywhere")[0].id, *silent);
  ASSERT_EQ(registry.Idle("cpu", "fake-host").size(), 1u);
  EXPECT_EQ(registry.Idle("cpu", "fake-host")[0].id, *listed);
  EXPECT_THAT(registry.Idle("cpu", "unregistered"), IsEmpty());
}

// ---------------------------------------------------------------------------------------------
// The worker: factories by name, and the executor asking its transport's capabilities.

// Transfers that never complete: every Wait fails with UNAVAILABLE. Records what was posted.
class FakeTransport final : public Transport {
 public:
  struct Posted {
    const void* data;
    size_t bytes;
    int peer;
    uint64_t tag;
  };

  FakeTransport(BackendDescriptor backend, int rank, int world_size)
      : backend_(std::move(backend)), rank_(rank), world_size_(world_size) {}

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  absl::string_view backend() const override { return backend_.name; }
  const BackendCapabilities& capabilities() const override { return backend_.capabilities; }
  absl::StatusOr<std::unique_ptr<Work>> Send(const void* data, size_t bytes, int peer,
                                             uint64_t tag) override {
    sends.push_back({data, bytes, peer, tag});
    return std::unique_ptr<Work>(new FailingWork);
  }
  absl::StatusOr<std::unique_ptr<Work>> Recv(void* data, size_t bytes, int peer,
                                             uint64_t tag) override {
    recvs.push_back({data, bytes, peer, tag});
    return std::unique_ptr<Work>(new FailingWork);
  }
  absl::Status Barrier(absl::Duration) override { return absl::OkStatus(); }
  void Abort() override {}
  TransferStats stats() const override { return {}; }

  std::vector<Posted> sends;
  std::vector<Posted> recvs;

 private:
  class FailingWork final : public Work {
   public:
    absl::Status Wait(absl::Duration) override {
      return absl::UnavailableError("fake transport: no peer");
    }
    bool Done() override { return true; }
  };

  const BackendDescriptor backend_;
  const int rank_;
  const int world_size_;
};

TEST(TransportRegistry, OffersAvailableFactoriesByCapabilityAndDevice) {
  BackendRegistry backends;
  ASSERT_TRUE(backends.Register(HostBackend("tcp")).ok());
  ASSERT_TRUE(backends.Register(DeviceBackend("rdma")).ok());
  ASSERT_TRUE(backends.Register(HostBackend("shm")).ok());
  TransportRegistry registry(&backends);
  auto create = [](const ConnectRequest&, RendezvousStore*) {
    return absl::StatusOr<std::unique_ptr<Transport>>(absl::InternalError("unused"));
  };
  EXPECT_TRUE(absl::IsNotFound(registry.Register({"mpi", nullptr, create})));
  EXPECT_TRUE(absl::IsInvalidArgument(registry.Register({"tcp", nullptr, nullptr})));
  ASSERT_TRUE(registry.Register({"tcp", nullptr, create}).ok());
  EXPECT_TRUE(absl::IsAlreadyExists(registry.Register({"tcp", nullptr, create})));
  ASSERT_TRUE(registry.Register({"rdma", nullptr, create}).ok());
  ASSERT_TRUE(registry.Register({"shm", [] { return false; }, create}).ok());
  // The CUDA-only backend needs a CUDA device; shm's factory is not available here.
  EXPECT_THAT(registry.Offered(-1), ElementsAre("tcp"));
  EXPECT_THAT(registry.Offered(0), ElementsAre("rdma", "tcp"));
  EXPECT_EQ(registry.FindOffered("rdma", -1).status().message(),
            "transport: this worker offers tcp, not 'rdma'");
  EXPECT_TRUE(registry.FindOffered("rdma", 0)->capabilities.takes_device_memory);
  ASSERT_TRUE(registry.Unregister("tcp").ok());
  EXPECT_TRUE(absl::IsNotFound(registry.Unregister("tcp")));
  EXPECT_THAT(registry.Offered(0), ElementsAre("rdma"));
}

TEST(TransportRegistry, GlobalOffersGlooEverywhereAndNcclOnlyWithAGpu) {
  const std::vector<std::string> cpu = TransportRegistry::Global().Offered(-1);
  EXPECT_THAT(cpu, ElementsAre(GlooDescriptor().name));
  const std::vector<std::string> gpu = TransportRegistry::Global().Offered(0);
  if (NcclAvailable()) {
    EXPECT_THAT(gpu, ElementsAre(GlooDescriptor().name, NcclDescriptor().name));
  } else {
    EXPECT_THAT(gpu, ElementsAre(GlooDescriptor().name));
  }
}

// What a fake factory was asked to connect.
struct Connected {
  int calls = 0;
  ConnectRequest request;
};

// MakeTransportFactory creates a fake backend by name, handing links only to a backend whose
// transfers are ordered per link.
TEST(TransportRegistry, WorkerFactoryGivesLinksToBackendsThatOrderPerLink) {
  BackendRegistry backends;
  ASSERT_TRUE(backends.Register(HostBackend("fake-tags")).ok());
  ASSERT_TRUE(backends.Register(DeviceBackend("fake-links")).ok());
  TransportRegistry registry(&backends);
  std::map<std::string, Connected> connected;
  for (const std::string name : {"fake-tags", "fake-links"}) {
    auto create = [&connected, &backends, name](
                      const ConnectRequest& request,
                      RendezvousStore*) -> absl::StatusOr<std::unique_ptr<Transport>> {
      ++connected[name].calls;
      connected[name].request = request;
      return std::unique_ptr<Transport>(new FakeTransport(
          *backends.Find(name), request.options.rank, request.options.world_size));
    };
    ASSERT_TRUE(registry.Register({name, nullptr, create}).ok());
  }
  worker::TransportConfig config;
  config.data_host = "10.0.0.7";
  config.cuda_device = 1;
  config.registry = &registry;
  EXPECT_THAT(worker::AvailableTransports(config), ElementsAre("fake-links", "fake-tags"));
  const runtime::TransportFactory factory = worker::MakeTransportFactory(config);

  runtime::TransportRequest request;
  request.rank = 1;
  request.world_size = 3;
  request.prefix = "job/7/attempt/2/";
  request.timeout = absl::Seconds(9);
  request.stage_to_rank = {0, 1, 2};
  InMemoryStore store;
  for (const std::string name : {"fake-tags", "fake-links"}) {
    request.backend = name;
    auto created = factory(request, &store);
    ASSERT_TRUE(created.ok()) << created.status();
    EXPECT_EQ((*created)->backend(), name);
    const Connected& c = connected[name];
    EXPECT_EQ(c.calls, 1);
    EXPECT_EQ(c.request.options.rank, 1);
    EXPECT_EQ(c.request.options.world_size, 3);
    EXPECT_EQ(c.request.options.key_prefix, "job/7/attempt/2/");
    EXPECT_EQ(c.request.options.connect_timeout, absl::Seconds(9));
    EXPECT_EQ(c.request.hostname, "10.0.0.7");
    EXPECT_EQ(c.request.cuda_device, 1);
    EXPECT_EQ(c.request.link_shift, runtime::kLinkShift);
  }
  EXPECT_THAT(connected["fake-tags"].request.links, IsEmpty());
  // Rank 1 of a three-stage chain: its links with ranks 0 and 2, as the runtime lists them.
  std::vector<std::pair<uint64_t, int>> links, expected;
  for (const Link& l : connected["fake-links"].request.links) links.push_back({l.link, l.peer});
  for (const runtime::Link& l : runtime::LinksOfRank({0, 1, 2}, 1, false, {})) {
    expected.push_back({l.link, l.peer});
  }
  EXPECT_FALSE(expected.empty());
  EXPECT_EQ(links, expected);

  request.backend = "mpi";
  EXPECT_EQ(factory(request, &store).status().message(),
            "transport: this worker offers fake-links, fake-tags, not 'mpi'");
  config.cuda_device = -1;  // a CPU worker does not offer the CUDA-only fake
  request.backend = "fake-links";
  EXPECT_TRUE(
      absl::IsInvalidArgument(worker::MakeTransportFactory(config)(request, &store).status()));
}

// A stage that hands its inputs on.
class IdentityStage final : public model::StageModel {
 public:
  std::vector<torch::Tensor> ForwardValues(const std::vector<torch::Tensor>& inputs) override {
    return inputs;
  }
  std::vector<std::pair<std::string, torch::Tensor>> NamedParameters() override { return {}; }
  void To(const torch::Device&) override {}
};

// Rank 1 of a two-stage pipeline computing on cuda:0 agrees shapes over `transport`: its first
// act is to receive stage 0's shapes into a buffer where the transport's capabilities say. The
// fake fails every wait, so that nothing else runs. c10::Error is returned as INTERNAL.
absl::Status AgreeShapesOnCuda(FakeTransport* transport) {
  runtime::ExecutorOptions options;
  options.rank = 1;
  options.num_stages = 2;
  options.num_microbatches = 1;
  options.stage_to_rank = {0, 1};
  options.comm_timeout = absl::Seconds(1);
  options.device = torch::Device(torch::kCUDA, 0);
  IdentityStage stage;
  runtime::PipelineExecutor executor(options, transport, {{1, &stage}});
  try {
    return executor.AgreeShapes({runtime::TensorMeta{{2, 4}, torch::kFloat32}});
  } catch (const c10::Error& e) {
    return absl::InternalError(e.what_without_backtrace());
  }
}

TEST(TransportByCapability, ExecutorStagesHostMemoryBackendsThroughTheCpu) {
  ScopedBackend fake(HostBackend("fake-host"));
  FakeTransport transport(*BackendRegistry::Global().Find("fake-host"), 1, 2);
  const absl::Status status = AgreeShapesOnCuda(&transport);
  // The receive was posted in host memory (no CUDA needed) and failed on the fake's wait.
  EXPECT_TRUE(absl::IsUnavailable(status)) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("fake transport: no peer"));
  ASSERT_EQ(transport.recvs.size(), 1u);
  EXPECT_NE(transport.recvs[0].data, nullptr);
  EXPECT_EQ(transport.recvs[0].peer, 0);
}

TEST(TransportByCapability, ExecutorHandsDeviceMemoryBackendsTheComputeDevice) {
  if (torch::cuda::is_available()) {
    GTEST_SKIP() << "checks the request for CUDA memory through LibTorch refusing it";
  }
  ScopedBackend fake(DeviceBackend("fake-device"));
  FakeTransport transport(*BackendRegistry::Global().Find("fake-device"), 1, 2);
  const absl::Status status = AgreeShapesOnCuda(&transport);
  // The executor asked LibTorch for the receive buffer on cuda:0, which this LibTorch cannot
  // allocate, so nothing was posted.
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(absl::AsciiStrToLower(status.message()), HasSubstr("cuda"));
  EXPECT_THAT(transport.recvs, IsEmpty());
}

}  // namespace
}  // namespace stagecoach::transport::transport_registry_test
