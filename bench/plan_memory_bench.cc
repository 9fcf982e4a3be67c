// Plan memory (coordinator/jobs/plan_memory.h): a large plan submitted and cancelled in a loop on
// a coordinator with no workers (real process, loopback), its heap in use
// (stagecoach_process_heap_in_use_bytes, scraped from its /metrics) after every round: flat
// after the first rounds when an ended job releases its action lists. Then, on a coordinator
// started with --max-plan-memory, jobs submitted without cancelling until admission refuses
// one: how many fit and the refusal.
//
//   plan_memory_bench [--rounds 20] [--stages 512] [--microbatches 976] [--limit 512MiB]
//
// The default spec is issue 44's: an MLP of 512 layers of width 8, 512 stages on 512 workers,
// 1F1B with 976 microbatches (about 3.5 million actions).
#include <iostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "tests/support/local_cluster.h"
#include "tests/support/prometheus_scrape.h"

namespace st = stagecoach::testing;

namespace {

std::string Spec(int stages, int microbatches) {
  std::string sizes;
  for (int i = 0; i <= stages; ++i) absl::StrAppend(&sizes, i ? ", " : "", 8);
  return absl::StrCat("name: plan-memory\nmodel: {builtin: {family: mlp, sizes: [", sizes,
                      "]}}\nsplit: {stages: ", stages, "}\nplacement: {workers: ", stages,
                      "}\nschedule: {kind: 1F1B, microbatches: ", microbatches,
                      "}\ntraining: {batch_size: ", microbatches, ", steps: 1}\n");
}

// A coordinator with no workers and its metrics address.
std::unique_ptr<st::LocalCluster> Coordinator(const std::vector<std::string>& extra,
                                              std::string* metrics) {
  st::ClusterOptions options;
  options.check_lock_order = false;
  options.workers = 0;
  options.log_level = "info";
  options.coordinator_args = {"--metrics-listen", "127.0.0.1:0"};
  for (const std::string& a : extra) options.coordinator_args.push_back(a);
  auto cluster = st::LocalCluster::Start(options);
  if (!cluster.ok()) {
    std::cerr << "cannot start the coordinator: " << cluster.status() << "\n";
    std::exit(1);
  }
  auto address = st::ReadMetricsAddress((*cluster)->coordinator());
  if (!address.ok()) {
    std::cerr << "no metrics address: " << address.status() << "\n";
    std::exit(1);
  }
  *metrics = *address;
  return std::move(*cluster);
}

double HeapMiB(const std::string& metrics) {
  auto samples = st::Scrape(metrics);
  if (!samples.ok()) return -1;
  auto it = samples->find("stagecoach_process_heap_in_use_bytes");
  return it == samples->end() ? -1 : it->second / (1 << 20);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("submit and cancel a large plan; print the coordinator's heap per round");
  int rounds = 20, stages = 512, microbatches = 976;
  std::string limit = "512MiB";
  app.add_option("--rounds", rounds, "submit-and-cancel rounds");
  app.add_option("--stages", stages, "stages (and workers) of the MLP");
  app.add_option("--microbatches", microbatches, "1F1B microbatches");
  app.add_option("--limit", limit, "--max-plan-memory of the second coordinator");
  CLI11_PARSE(app, argc, argv);
  const std::string spec = Spec(stages, microbatches);

  std::string metrics;
  auto cluster = Coordinator({}, &metrics);
  std::vector<double> heap;
  const double before = HeapMiB(metrics);
  std::cout << absl::StrFormat("heap before any job: %.1f MiB\n", before);
  std::cout << "round  submit+cancel  heap in use\n";
  for (int r = 1; r <= rounds; ++r) {
    const absl::Time start = absl::Now();
    auto id = cluster->Submit(spec);
    if (!id.ok()) {
      std::cerr << "round " << r << ": submit failed: " << id.status() << "\n";
      return 1;
    }
    if (absl::Status cancelled = cluster->Cancel(*id); !cancelled.ok()) {
      std::cerr << "round " << r << ": cancel failed: " << cancelled << "\n";
      return 1;
    }
    heap.push_back(HeapMiB(metrics));
    std::cout << absl::StrFormat("%5d  %12.2fs  %8.1f MiB\n", r,
                                 absl::ToDoubleSeconds(absl::Now() - start), heap.back());
  }
  const size_t from = std::min<size_t>(2, heap.size() - 1);
  std::cout << absl::StrFormat(
      "heap after round %d: %.1f MiB; after round %d: %.1f MiB; growth %.2f MiB per round "
      "over rounds %d..%d\n",
      static_cast<int>(from + 1), heap[from], rounds, heap.back(),
      (heap.back() - heap[from]) / std::max<double>(1.0, rounds - 1 - static_cast<double>(from)),
      static_cast<int>(from + 1), rounds);

  cluster.reset();
  auto bounded = Coordinator({"--max-plan-memory", limit}, &metrics);
  double previous = HeapMiB(metrics);
  for (int n = 1;; ++n) {
    auto id = bounded->Submit(spec);
    if (id.ok()) {
      const double now = HeapMiB(metrics);
      std::cout << absl::StrFormat("live job %d admitted: heap in use %.1f MiB (+%.1f MiB)\n", n,
                                   now, now - previous);
      previous = now;
    } else {
      std::cout << "--max-plan-memory " << limit << ": " << n - 1
                << " live jobs admitted, the next refused:\n  " << id.status() << "\n";
      break;
    }
    if (n > 1000) {
      std::cout << "--max-plan-memory " << limit << ": no refusal after 1000 jobs\n";
      return 1;
    }
  }
  return 0;
}
