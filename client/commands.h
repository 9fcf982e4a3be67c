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
  // Bound on every unary call (SubmitJob gets kSubmitInspectionAllowance more).
  absl::Duration timeout = absl::Seconds(15);
};

// How much longer than other calls SubmitJob may take: the coordinator may inspect (and profile)
// the model on a worker before it answers.
inline constexpr absl::Duration kSubmitInspectionAllowance = absl::Seconds(150);

// Local files `submit` uploads to the coordinator's artifact store before it sends the spec;
// the spec's field then names the upload ("artifact:<sha256>"). Empty: nothing to upload.
struct SubmitUploads {
  std::string model;  // --model: replaces model.torchscript
  std::string data;   // --data: replaces data.path
};

class Commands {
 public:
  // Bytes per UploadArtifact message.
  static constexpr int kUploadChunkBytes = 1 << 20;

  Commands(ClientOptions options, std::ostream& out, std::ostream& err);

  // Submits the spec in `spec_path`, first uploading the files in `uploads` (each reported on
  // `err` as "uploaded NAME (SIZE, N chunks) as artifact:<sha256>"). A file that cannot be
  // read, or --model with a spec whose model is builtin, is a usage error (2).
  int Submit(const std::string& spec_path, bool wait, const SubmitUploads& uploads = {});
  int List();
  int Status(const std::string& job_id);
  int Watch(const std::string& job_id);
  int Cancel(const std::string& job_id);
  // Asks a running job for a checkpoint now and prints the step it is taken after and its
  // directory (table: "step N: DIR"; json/yaml: {job_id, step, directory}). The checkpoint is
  // complete once `status` lists it.
  int Checkpoint(const std::string& job_id);
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
  // Uploads the file at `path` (named by option `flag` in messages) and sets `*uri` to the
  // artifact's uri. Returns 0, 2 when the file cannot be read, or 1 when the upload fails.
  int UploadFile(const std::string& path, const std::string& flag, std::string* uri);

  ClientOptions options_;
  std::ostream& out_;
  std::ostream& err_;
  std::unique_ptr<v1::CoordinatorService::Stub> stub_;
};

}  // namespace stagecoach::client
