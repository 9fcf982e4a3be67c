// Prometheus metrics shared by both daemons: the build-info gauge, the bucket layout of duration
// histograms, and the HTTP endpoint (`--metrics-listen HOST:PORT`) that serves a registry at
// /metrics. Each daemon owns one prometheus::Registry; its sinks
// (coordinator/metrics/coordinator_metrics.h, worker/service/worker_metrics.h) define their metrics
// on it.
// Naming follows STYLE.md rule 13 (`stagecoach_` prefix, base units, `_total` counters).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/registry.h"

namespace stagecoach::metrics {

// The project version the binary was built from (CMake's PROJECT_VERSION), e.g. "0.1.0".
const char* BuildVersion();

// Registers `stagecoach_build_info{version="<BuildVersion()>"} 1` on `registry`.
void AddBuildInfo(prometheus::Registry& registry);

// Bucket upper bounds, in seconds, for step and action durations: 100 us to ~100 s, roughly
// three per decade.
std::vector<double> DurationBucketsSeconds();

// The registry's current samples in the Prometheus text exposition format (what /metrics
// serves); for logs and tests that read metrics without HTTP.
std::string SerializeText(const prometheus::Registry& registry);

// An HTTP/1.0 server answering GET /metrics with a registry's samples, one connection at a time
// on its own thread (a scrape every few seconds needs no more). It is not prometheus-cpp's
// civetweb Exposer: civetweb's fixed small thread stacks cannot hold the static TLS of LibTorch
// and CUDA, so its threads fail to start in the worker (pthread_create: EINVAL).
class MetricsServer {
 public:
  // Listens on `listen` ("HOST:PORT"; port 0 picks a free port) and serves `registry`, which
  // the server keeps alive; `before_scrape`, when given, runs on the server's thread before each
  // scrape is serialized (gauges read afresh, e.g. ProcessMetrics::Refresh). INVALID_ARGUMENT
  // naming `flag` when `listen` is not HOST:PORT; UNAVAILABLE naming the address when it cannot
  // be bound.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& listen, std::shared_ptr<prometheus::Registry> registry,
      const std::string& flag = "--metrics-listen", std::function<void()> before_scrape = {});
  // Stops serving; returns within about 100 ms.
  ~MetricsServer();

  // The bound address, HOST:PORT with the actual port.
  const std::string& address() const { return address_; }
  int port() const { return port_; }

 private:
  MetricsServer() = default;

  // Serves connections until stop_ is set.
  void Serve();

  std::shared_ptr<prometheus::Registry> registry_;
  std::function<void()> before_scrape_;
  std::string address_;
  int port_ = 0;
  int listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace stagecoach::metrics
