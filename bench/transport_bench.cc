// Gloo point-to-point bandwidth between two ranks of one process (two threads, loopback TCP,
// InMemoryStore rendezvous) for 1 to 64 MiB messages, against a plain memcpy of the same size,
// and the round-trip latency of a 4-byte message. A transfer is timed from posting the send
// (the receive is already posted) until the receive completed; every figure is the median of
// --iterations runs after --warmup untimed ones. GB/s is 10^9 bytes per second.
//
//   build/bench/transport_bench [--iterations N] [--warmup N] [--latency-iterations N]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "bench/bench_support.h"
#include "worker/transport/gloo/factory.h"
#include "worker/transport/in_memory_store.h"
#include "worker/transport/transport.h"

namespace tr = stagecoach::transport;

namespace {

using stagecoach::bench::Check;
using stagecoach::bench::Fail;
using stagecoach::bench::Median;

using Clock = std::chrono::steady_clock;

constexpr absl::Duration kWait = absl::Seconds(60);

std::unique_ptr<tr::Work> Post(const std::string& what,
                               absl::StatusOr<std::unique_ptr<tr::Work>> work) {
  if (!work.ok()) Fail(what, work.status());
  return std::move(work).value();
}

double Percentile(std::vector<double> values, double p) {
  std::sort(values.begin(), values.end());
  const size_t index = std::min(values.size() - 1, static_cast<size_t>(p * values.size()));
  return values[index];
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Two connected Gloo transports, rank 0 and rank 1.
std::vector<std::unique_ptr<tr::Transport>> ConnectPair() {
  tr::InMemoryStore store;
  std::vector<absl::StatusOr<std::unique_ptr<tr::Transport>>> created(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      tr::GlooOptions options;
      options.rank = rank;
      options.world_size = 2;
      options.key_prefix = "bench/";
      created[rank] = tr::CreateGlooTransport(options, &store);
    });
  }
  for (std::thread& thread : threads) thread.join();
  std::vector<std::unique_ptr<tr::Transport>> pair;
  for (auto& transport : created) {
    if (!transport.ok()) Fail("connecting", transport.status());
    pair.push_back(std::move(transport).value());
  }
  return pair;
}

// A reusable meeting point for two threads.
class Meet {
 public:
  void Arrive() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t generation = generation_;
    if (++arrived_ == 2) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != generation; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
};

// One transfer of `bytes` from rank 0 to rank 1; returns its seconds.
double TimeTransfer(std::vector<std::unique_ptr<tr::Transport>>& pair, const uint8_t* src,
                    uint8_t* dst, size_t bytes, uint64_t tag) {
  Meet meet;
  Clock::time_point received;
  std::thread receiver([&] {
    auto recv = Post("posting the receive", pair[1]->Recv(dst, bytes, 0, tag));
    meet.Arrive();
    Check("receiving", recv->Wait(kWait));
    received = Clock::now();
  });
  meet.Arrive();
  const Clock::time_point start = Clock::now();
  auto send = Post("posting the send", pair[0]->Send(src, bytes, 1, tag));
  Check("sending", send->Wait(kWait));
  receiver.join();
  return Seconds(received - start);
}

// Keeps memcpy's result observable.
volatile uint8_t g_sink = 0;

double TimeMemcpy(const uint8_t* src, uint8_t* dst, size_t bytes) {
  const Clock::time_point start = Clock::now();
  std::memcpy(dst, src, bytes);
  const double seconds = Seconds(Clock::now() - start);
  g_sink = dst[bytes / 2];
  return seconds;
}

// Round trips of a 4-byte message from rank 0 to rank 1 and back; returns their seconds.
std::vector<double> TimeRoundTrips(std::vector<std::unique_ptr<tr::Transport>>& pair, int warmup,
                                   int iterations) {
  const int total = warmup + iterations;
  std::thread echo([&] {
    uint32_t value = 0;
    for (int i = 0; i < total; ++i) {
      auto recv = Post("echo: posting the receive", pair[1]->Recv(&value, 4, 0, 1000));
      Check("echo: receiving", recv->Wait(kWait));
      auto send = Post("echo: posting the send", pair[1]->Send(&value, 4, 0, 1001));
      Check("echo: sending", send->Wait(kWait));
    }
  });
  std::vector<double> seconds;
  uint32_t ping = 0, pong = 0;
  for (int i = 0; i < total; ++i) {
    ping = static_cast<uint32_t>(i);
    const Clock::time_point start = Clock::now();
    auto recv = Post("posting the receive", pair[0]->Recv(&pong, 4, 1, 1001));
    auto send = Post("posting the send", pair[0]->Send(&ping, 4, 1, 1000));
    Check("sending", send->Wait(kWait));
    Check("receiving", recv->Wait(kWait));
    const double elapsed = Seconds(Clock::now() - start);
    if (pong != ping) {
      std::fprintf(stderr, "round trip %d: got %u back\n", i, pong);
      std::exit(1);
    }
    if (i >= warmup) seconds.push_back(elapsed);
  }
  echo.join();
  return seconds;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Gloo point-to-point bandwidth and latency between two ranks of one process"};
  int iterations = 10;
  int warmup = 2;
  int latency_iterations = 2000;
  app.add_option("--iterations", iterations, "timed transfers per size")
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed transfers per size first")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--latency-iterations", latency_iterations, "timed 4-byte round trips")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  std::vector<std::unique_ptr<tr::Transport>> pair = ConnectPair();

  constexpr size_t kMiB = size_t{1} << 20;
  const std::vector<size_t> sizes = {1 * kMiB,  2 * kMiB,  4 * kMiB, 8 * kMiB,
                                     16 * kMiB, 32 * kMiB, 64 * kMiB};
  std::vector<uint8_t> src(sizes.back()), dst(sizes.back());
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 2654435761u >> 24);
  std::fill(dst.begin(), dst.end(), 0);  // Touches every page before timing.

  std::printf(
      "Gloo point-to-point, 2 ranks in one process over loopback TCP, vs memcpy "
      "(median of %d, GB/s = 1e9 B/s)\n\n",
      iterations);
  std::printf("%8s  %10s  %12s  %12s  %8s\n", "size", "gloo GB/s", "gloo ms", "memcpy GB/s",
              "ratio");
  uint64_t tag = 0;
  for (size_t bytes : sizes) {
    std::vector<double> gloo, copy;
    for (int i = 0; i < warmup + iterations; ++i) {
      const double seconds = TimeTransfer(pair, src.data(), dst.data(), bytes, tag++);
      if (i == 0 && std::memcmp(src.data(), dst.data(), bytes) != 0) {
        std::fprintf(stderr, "%zu bytes: the received data differs\n", bytes);
        return 1;
      }
      if (i >= warmup) gloo.push_back(seconds);
    }
    for (int i = 0; i < warmup + iterations; ++i) {
      const double seconds = TimeMemcpy(src.data(), dst.data(), bytes);
      if (i >= warmup) copy.push_back(seconds);
    }
    const double gloo_s = Median(gloo), copy_s = Median(copy);
    const double gloo_gbps = bytes / gloo_s / 1e9, copy_gbps = bytes / copy_s / 1e9;
    std::printf("%5zu MiB  %10.2f  %12.2f  %12.2f  %8.3f\n", bytes / kMiB, gloo_gbps, gloo_s * 1e3,
                copy_gbps, gloo_gbps / copy_gbps);
  }

  const std::vector<double> rtt = TimeRoundTrips(pair, 100, latency_iterations);
  std::printf("\n4-byte round trip (%d): median %.1f us, p90 %.1f us, p99 %.1f us\n",
              latency_iterations, Median(rtt) * 1e6, Percentile(rtt, 0.90) * 1e6,
              Percentile(rtt, 0.99) * 1e6);

  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      Check("barrier", pair[rank]->Barrier(kWait));
      pair[rank].reset();
    });
  }
  for (std::thread& thread : threads) thread.join();
  return 0;
}
