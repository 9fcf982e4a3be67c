// stagectl's commands against a coordinator. Each returns the process exit code: 0 success,
// 1 a failed operation or a job that did not succeed, 2 a usage error. Output goes to `out`,
// progress and errors to `err`.
#pragma once

#include <iosfwd>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "client/render.h"
#include "stagecoach/v1/coordinator.grpc.pb.h"

namespace stagecoach::client {

struct ClientOptions {
  std::string coordinator;  // host:port
  OutputFormat format = OutputFormat::kTable;
  // Bound on every unary call.
  absl::Duration timeout = absl::Seconds(15);
};

class Commands {
 public:
  Commands(ClientOptions options, std::ostream& out, std::ostream& err);

  int Submit(const std::string& spec_path, bool wait);
  int List();
  int Status(const std::string& job_id);
  int Watch(const std::string& job_id);
  int Cancel(const std::string& job_id);
  int Workers();
  // Runs forward-only inference of the spec's model on the batch in `input_path` (.npy) and
  // writes the outputs to `out_path` (.npy), or prints them when it is empty: a summary (table)
  // or the tensor's shape and values (json, yaml). `timeout` bounds the whole run, queueing
  // included.
  int Infer(const std::string& spec_path, const std::string& input_path,
            const std::string& out_path, absl::Duration timeout);

 private:
  // Prints a failed call's error and returns 1. UNAVAILABLE becomes a message saying the
  // coordinator cannot be reached and how to point stagectl at it.
  int RpcError(const grpc::Status& status, const std::string& what);
  // Streams the job's events to the terminal until it ends; returns the exit code for its
  // final state. `progress_only` prints a compact progress line (submit --wait).
  int Follow(const std::string& job_id, std::ostream& progress);

  ClientOptions options_;
  std::ostream& out_;
  std::ostream& err_;
  std::unique_ptr<v1::CoordinatorService::Stub> stub_;
};

}  // namespace stagecoach::client
