// Artifact upload and fetch over real gRPC on loopback: a CoordinatorService with a real job
// manager and artifact store in this process (port 0), the stagectl binary submitting specs with
// --data / --model, a coordinator process wired with --data-dir and --max-upload-bytes, and the
// worker's ArtifactCache fetching through its CoordinatorClient. Checks multi-chunk uploads
// fetched back byte for byte, refused uploads (checksum, size, limit, malformed streams) that
// leave nothing behind, the spec's field set to the returned uri, and the cache's behaviour.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc/channel.h"
#include "common/rpc/server.h"
#include "common/spec/spec_parser.h"
#include "common/util/sha256.h"
#include "common/util/work_queue.h"
#include "coordinator/job_manager.h"
#include "coordinator/service/artifact_store.h"
#include "coordinator/service/coordinator_service.h"
#include "coordinator/workers/grpc_worker_client.h"
#include "coordinator/workers/kv_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/job_predicates.h"
#include "tests/support/local_cluster.h"
#include "tests/support/process.h"
#include "tests/support/python.h"
#include "worker/service/artifact_cache.h"
#include "worker/service/coordinator_client.h"

namespace stagecoach::testing::artifact_upload_test {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr int kChunk = 1 << 20;
constexpr int64_t kLimit = 8 << 20;  // the in-process coordinator's upload limit

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(gen() & 0xff);
  return out;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// A spec that trains a built-in MLP on a tensors file; `data` is its data.path.
std::string TensorsSpec(const std::string& data) {
  return absl::StrCat(
      "name: uploaded-data\n"
      "model:\n  builtin: {family: mlp, sizes: [8, 16, 3]}\n"
      "split: {stages: 2}\n"
      "schedule: {kind: GPipe, microbatches: 2}\n"
      "placement: {workers: 2}\n"
      "training:\n  batch_size: 4\n  steps: 2\n  loss: mse\n"
      "  optimizer: {kind: sgd, lr: 0.1}\n"
      "data: {kind: tensors, path: ",
      data, "}\n");
}

// The same job with a TorchScript model.
std::string TorchScriptSpec(const std::string& model) {
  return absl::StrCat("name: uploaded-model\n", "model:\n  torchscript: ", model, "\n",
                      "split: {stages: 2}\n"
                      "schedule: {kind: GPipe, microbatches: 2}\n"
                      "placement: {workers: 2}\n"
                      "training:\n  batch_size: 4\n  steps: 2\n  loss: mse\n"
                      "  optimizer: {kind: sgd, lr: 0.1}\n"
                      "data: {kind: tensors, path: /data/train.pt}\n");
}

struct UploadResult {
  grpc::Status status;
  v1::UploadArtifactResponse response;
};

// Sends `messages` as one UploadArtifact stream.
UploadResult Upload(v1::CoordinatorService::Stub* stub,
                    const std::vector<v1::UploadArtifactRequest>& messages) {
  UploadResult out;
  grpc::ClientContext ctx;
  rpc::SetDeadline(&ctx, absl::Seconds(30));
  auto writer = stub->UploadArtifact(&ctx, &out.response);
  for (const auto& m : messages) {
    if (!writer->Write(m)) break;
  }
  writer->WritesDone();
  out.status = writer->Finish();
  return out;
}

v1::UploadArtifactRequest Header(const std::string& name, int64_t size, const std::string& sha) {
  v1::UploadArtifactRequest m;
  m.mutable_header()->set_name(name);
  m.mutable_header()->set_size_bytes(size);
  m.mutable_header()->set_sha256(sha);
  return m;
}

v1::UploadArtifactRequest Chunk(absl::string_view bytes) {
  v1::UploadArtifactRequest m;
  m.set_chunk(std::string(bytes));
  return m;
}

// The header, then `bytes` in 1 MiB chunks, declaring `sha`.
std::vector<v1::UploadArtifactRequest> Messages(const std::string& name, const std::string& bytes,
                                                const std::string& sha) {
  std::vector<v1::UploadArtifactRequest> out{Header(name, static_cast<int64_t>(bytes.size()), sha)};
  for (size_t at = 0; at < bytes.size(); at += kChunk) {
    out.push_back(Chunk(absl::string_view(bytes).substr(at, kChunk)));
  }
  return out;
}

struct Fetched {
  grpc::Status status;
  v1::ArtifactHeader header;
  std::string bytes;
  int chunks = 0;
};

Fetched Fetch(v1::CoordinatorService::Stub* stub, const std::string& id) {
  Fetched out;
  grpc::ClientContext ctx;
  rpc::SetDeadline(&ctx, absl::Seconds(30));
  v1::FetchArtifactRequest req;
  req.set_artifact_id(id);
  auto reader = stub->FetchArtifact(&ctx, req);
  v1::FetchArtifactResponse m;
  bool first = true;
  while (reader->Read(&m)) {
    if (first) {
      EXPECT_TRUE(m.has_header()) << "the first message must be the header";
      out.header = m.header();
      first = false;
      continue;
    }
    EXPECT_TRUE(m.has_chunk()) << "message after the header without a chunk";
    out.bytes += m.chunk();
    ++out.chunks;
  }
  out.status = reader->Finish();
  return out;
}

// A coordinator in this process: job manager, key-value store, artifact store (limit kLimit),
// CoordinatorService on 127.0.0.1:0.
class InProcessCoordinator : public ::testing::Test {
 protected:
  void SetUp() override {
    coordinator::ArtifactStoreOptions store_options;
    store_options.dir = dir_.path() + "/artifacts";
    store_options.max_bytes = kLimit;
    auto store = coordinator::ArtifactStore::Open(store_options);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    coordinator::JobManagerDeps deps{Clock::Real(), &workers_, &kv_};
    deps.executor = &background_;
    jobs_ = std::make_unique<coordinator::JobManager>(coordinator::JobManagerOptions{}, deps);
    service_ =
        std::make_unique<coordinator::CoordinatorServiceImpl>(jobs_.get(), &kv_, store_.get());
    auto started = rpc::StartServer({"127.0.0.1", 0}, {service_.get()});
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = std::move(started->server);
    address_ = absl::StrCat("127.0.0.1:", started->port);
    stub_ = v1::CoordinatorService::NewStub(rpc::MakeChannel(address_));
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }

  // Files in the store's directory, temporary ones included.
  std::vector<std::string> StoreFiles() {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(store_->dir())) {
      out.push_back(e.path().filename().string());
    }
    return out;
  }

  CommandResult Stagectl(const std::vector<std::string>& args) {
    std::vector<std::string> argv{StagectlBinary(), "--coordinator", address_};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, absl::Seconds(60));
  }

  absl::StatusOr<v1::Job> GetJob(const std::string& id) {
    grpc::ClientContext ctx;
    rpc::SetDeadline(&ctx, absl::Seconds(10));
    v1::GetJobRequest req;
    req.set_job_id(id);
    v1::GetJobResponse resp;
    grpc::Status s = stub_->GetJob(&ctx, req, &resp);
    if (!s.ok())
      return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
    return resp.job();
  }

  int NumJobs() {
    grpc::ClientContext ctx;
    rpc::SetDeadline(&ctx, absl::Seconds(10));
    v1::ListJobsResponse resp;
    EXPECT_TRUE(stub_->ListJobs(&ctx, {}, &resp).ok());
    return resp.jobs_size();
  }

  TempDir dir_;
  std::unique_ptr<coordinator::ArtifactStore> store_;
  coordinator::KvStore kv_;
  coordinator::GrpcWorkerClient workers_;
  WorkQueue background_{2};
  std::unique_ptr<coordinator::JobManager> jobs_;
  std::unique_ptr<coordinator::CoordinatorServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::unique_ptr<v1::CoordinatorService::Stub> stub_;
};

using ArtifactUpload = InProcessCoordinator;

TEST_F(ArtifactUpload, LargeUploadArrivesInChunksAndFetchesBackIdentical) {
  const std::string bytes = RandomBytes(5 * kChunk + 12345, 1);
  const std::string sha = Sha256Hex(bytes);
  UploadResult up = Upload(stub_.get(), Messages("model.pt", bytes, sha));
  ASSERT_TRUE(up.status.ok()) << up.status.error_message();
  EXPECT_EQ(up.response.artifact_id(), sha);
  EXPECT_EQ(up.response.uri(), "artifact:" + sha);
  EXPECT_EQ(up.response.size_bytes(), static_cast<int64_t>(bytes.size()));
  EXPECT_EQ(up.response.chunks(), 6);

  for (const std::string& ref : {sha, "artifact:" + sha}) {
    Fetched got = Fetch(stub_.get(), ref);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_EQ(got.header.name(), "model.pt");
    EXPECT_EQ(got.header.sha256(), sha);
    EXPECT_EQ(got.header.size_bytes(), static_cast<int64_t>(bytes.size()));
    EXPECT_EQ(got.chunks, 6);
    EXPECT_TRUE(got.bytes == bytes) << "fetched bytes differ from the uploaded ones";
  }

  // The same bytes again: the same id, still one file.
  UploadResult again = Upload(stub_.get(), Messages("copy.pt", bytes, sha));
  ASSERT_TRUE(again.status.ok()) << again.status.error_message();
  EXPECT_EQ(again.response.artifact_id(), sha);
  EXPECT_THAT(StoreFiles(), ::testing::ElementsAre(sha));
}

TEST_F(ArtifactUpload, CorruptedUploadIsRefusedByItsChecksum) {
  const std::string bytes = RandomBytes(3 * kChunk, 2);
  const std::string sha = Sha256Hex(bytes);
  std::string corrupted = bytes;
  corrupted[2 * kChunk + 7] ^= 0x40;  // flipped after the header's checksum was computed
  UploadResult up = Upload(stub_.get(), Messages("model.pt", corrupted, sha));
  ASSERT_EQ(up.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(up.status.error_message(), HasSubstr("sha256"));
  EXPECT_THAT(up.status.error_message(), HasSubstr(sha));
  EXPECT_THAT(up.status.error_message(), HasSubstr(Sha256Hex(corrupted)));
  EXPECT_TRUE(StoreFiles().empty());
  EXPECT_EQ(Fetch(stub_.get(), sha).status.error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(ArtifactUpload, SizeMismatchIsRefused) {
  const std::string bytes = RandomBytes(kChunk + 10, 3);
  auto messages = Messages("data.pt", bytes, Sha256Hex(bytes));
  messages[0].mutable_header()->set_size_bytes(bytes.size() + 1);
  UploadResult up = Upload(stub_.get(), messages);
  ASSERT_EQ(up.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(up.status.error_message(), HasSubstr("size"));
  EXPECT_THAT(up.status.error_message(), HasSubstr(std::to_string(bytes.size() + 1)));
  EXPECT_THAT(up.status.error_message(), HasSubstr(std::to_string(bytes.size())));
  EXPECT_TRUE(StoreFiles().empty());
}

TEST_F(ArtifactUpload, OverTheLimitIsRefused) {
  // Declared in the header.
  UploadResult declared =
      Upload(stub_.get(), {Header("huge.pt", kLimit + 1, Sha256Hex("x")), Chunk("x")});
  ASSERT_EQ(declared.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(declared.status.error_message(), HasSubstr(std::to_string(kLimit)));
  // A header that understates the size: refused as the bytes pass the limit.
  const std::string bytes = RandomBytes(kLimit + 1, 4);
  UploadResult arriving =
      Upload(stub_.get(), {Header("liar.pt", kChunk, Sha256Hex(bytes)), Chunk(bytes)});
  ASSERT_EQ(arriving.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(arriving.status.error_message(), HasSubstr("limit"));
  EXPECT_TRUE(StoreFiles().empty());
}

TEST_F(ArtifactUpload, MalformedStreamsAreRefused) {
  UploadResult empty = Upload(stub_.get(), {});
  EXPECT_EQ(empty.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(empty.status.error_message(), HasSubstr("missing header"));

  UploadResult chunk_first = Upload(stub_.get(), {Chunk("abc"), Header("a", 3, Sha256Hex("abc"))});
  EXPECT_EQ(chunk_first.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(chunk_first.status.error_message(), HasSubstr("header not first"));

  UploadResult two_headers =
      Upload(stub_.get(), {Header("a", 3, Sha256Hex("abc")), Header("a", 3, Sha256Hex("abc"))});
  EXPECT_EQ(two_headers.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(two_headers.status.error_message(), HasSubstr("second header"));

  UploadResult bad_sha = Upload(stub_.get(), {Header("a", 3, "not-hex"), Chunk("abc")});
  EXPECT_EQ(bad_sha.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad_sha.status.error_message(), HasSubstr("header.sha256"));
  EXPECT_TRUE(StoreFiles().empty());
}

TEST_F(ArtifactUpload, UnknownIdIsNotFound) {
  const std::string id = Sha256Hex("nobody uploaded this");
  Fetched got = Fetch(stub_.get(), "artifact:" + id);
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(got.status.error_message(), HasSubstr(id));
}

// --- stagectl submit --data / --model ---

TEST_F(ArtifactUpload, StagectlSubmitDataUploadsAndSetsDataPath) {
  const std::string data = dir_.path() + "/train.pt";
  const std::string bytes = RandomBytes(2 * kChunk + 100, 5);
  WriteAll(data, bytes);
  const std::string spec = dir_.path() + "/job.yaml";
  WriteAll(spec, TensorsSpec("/nowhere/on/the/workers.pt"));
  CommandResult r = Stagectl({"submit", spec, "--data", data});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string uri = "artifact:" + Sha256Hex(bytes);
  EXPECT_THAT(r.err, HasSubstr(absl::StrCat("uploaded train.pt (2.0 MiB, 3 chunks) as ", uri)));
  const std::string job_id = LastLine(r.out);
  auto job = GetJob(job_id);
  ASSERT_TRUE(job.ok()) << job.status() << "\n" << r.out;
  auto parsed = spec::ParseJobSpec(job->spec_yaml(), "submitted");
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << job->spec_yaml();
  EXPECT_EQ(parsed->data.path, uri);
  EXPECT_EQ(parsed->data.kind, "tensors");
  EXPECT_EQ(parsed->name, "uploaded-data");
  // The workers will fetch exactly these bytes.
  Fetched got = Fetch(stub_.get(), uri);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_TRUE(got.bytes == bytes);

  // The printed uri reuses the upload without sending the file again.
  CommandResult reuse = Stagectl({"submit", spec, "--data", uri});
  ASSERT_EQ(reuse.exit_code, 0) << reuse.err;
  EXPECT_THAT(reuse.err, ::testing::Not(HasSubstr("uploaded")));
  auto reused = GetJob(LastLine(reuse.out));
  ASSERT_TRUE(reused.ok()) << reused.status();
  EXPECT_EQ(spec::ParseJobSpec(reused->spec_yaml(), "submitted")->data.path, uri);
  CommandResult malformed = Stagectl({"submit", spec, "--data", "artifact:xyz"});
  EXPECT_EQ(malformed.exit_code, 2);
  EXPECT_THAT(malformed.err, HasSubstr("artifact:xyz"));
}

TEST_F(ArtifactUpload, StagectlSubmitModelUploadsAndSetsModelTorchscript) {
  const std::string model = dir_.path() + "/model.pt";
  const std::string bytes = RandomBytes(kChunk / 2, 6);
  WriteAll(model, bytes);
  const std::string spec = dir_.path() + "/job.yaml";
  WriteAll(spec, TorchScriptSpec("local.pt"));
  CommandResult r = Stagectl({"submit", spec, "--model", model});
  const std::string uri = "artifact:" + Sha256Hex(bytes);
  EXPECT_THAT(r.err, HasSubstr(absl::StrCat("uploaded model.pt (512.0 KiB, 1 chunk) as ", uri)));
  Fetched got = Fetch(stub_.get(), uri);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_TRUE(got.bytes == bytes);
  if (r.exit_code == 0) {
    auto job = GetJob(LastLine(r.out));
    ASSERT_TRUE(job.ok()) << job.status();
    auto parsed = spec::ParseJobSpec(job->spec_yaml(), "submitted");
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->model.torchscript.value_or(""), uri);
  } else {
    // This coordinator cannot plan TorchScript models yet: the spec that reached it named the
    // upload, and the planner refused that field.
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_THAT(r.err, HasSubstr("model.torchscript"));
  }
}

TEST_F(ArtifactUpload, StagectlSubmitWithAMissingFileIsAUsageError) {
  const std::string spec = dir_.path() + "/job.yaml";
  WriteAll(spec, TensorsSpec("x.pt"));
  const std::string missing = dir_.path() + "/no-such.pt";
  CommandResult data = Stagectl({"submit", spec, "--data", missing});
  EXPECT_EQ(data.exit_code, 2);
  EXPECT_THAT(data.err, HasSubstr("--data"));
  EXPECT_THAT(data.err, HasSubstr(missing));
  CommandResult directory = Stagectl({"submit", spec, "--data", dir_.path()});
  EXPECT_EQ(directory.exit_code, 2);
  EXPECT_THAT(directory.err, HasSubstr("not a regular file"));
  EXPECT_EQ(NumJobs(), 0);
  EXPECT_TRUE(StoreFiles().empty());
}

TEST_F(ArtifactUpload, StagectlSubmitModelWithABuiltinSpecIsAUsageError) {
  const std::string model = dir_.path() + "/model.pt";
  WriteAll(model, "torchscript bytes");
  const std::string spec = dir_.path() + "/job.yaml";
  WriteAll(spec, TensorsSpec("x.pt"));
  CommandResult r = Stagectl({"submit", spec, "--model", model});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("model.builtin"));
  EXPECT_TRUE(StoreFiles().empty()) << "nothing is uploaded for a spec that cannot use it";
}

// --- the coordinator binary's flags ---

TEST(CoordinatorFlags, DataDirAndUploadLimit) {
  TempDir dir;
  auto coordinator =
      ChildProcess::Start({CoordinatorBinary(), "--listen", "127.0.0.1:0", "--data-dir",
                           dir.path() + "/state", "--max-upload-bytes", "3000000"},
                          dir.path() + "/coordinator.log");
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  auto line = (*coordinator)->ReadLine(absl::Seconds(20));
  ASSERT_TRUE(line.ok()) << line.status() << (*coordinator)->StderrTail();
  absl::string_view listening = *line;
  ASSERT_TRUE(absl::ConsumePrefix(&listening, "listening on ")) << *line;
  const std::string address(listening);

  const std::string spec = dir.path() + "/job.yaml";
  WriteAll(spec, TensorsSpec("x.pt"));
  const std::string small = dir.path() + "/small.pt";
  const std::string small_bytes = RandomBytes(2900000, 7);
  WriteAll(small, small_bytes);
  CommandResult ok =
      RunCommand({StagectlBinary(), "--coordinator", address, "submit", spec, "--data", small},
                 absl::Seconds(60));
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(ReadAll(dir.path() + "/state/artifacts/" + Sha256Hex(small_bytes)), small_bytes);

  const std::string big = dir.path() + "/big.pt";
  WriteAll(big, RandomBytes(3000001, 8));
  CommandResult refused =
      RunCommand({StagectlBinary(), "--coordinator", address, "submit", spec, "--data", big},
                 absl::Seconds(60));
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_THAT(refused.err, HasSubstr("3000000"));
  EXPECT_THAT(refused.err, HasSubstr("limit"));
  (*coordinator)->Stop();

  CommandResult bad = RunCommand(
      {CoordinatorBinary(), "--max-upload-bytes", "lots", "--check-config"}, absl::Seconds(20));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--max-upload-bytes"));
}

// --- the worker's artifact cache against the coordinator ---

// Counts the fetches that reach the coordinator (the real CoordinatorClient does them).
class CountingSource : public worker::ArtifactSource {
 public:
  explicit CountingSource(worker::ArtifactSource* inner) : inner_(inner) {}
  absl::StatusOr<v1::ArtifactHeader> FetchArtifact(
      const std::string& id, absl::Duration timeout,
      const std::function<absl::Status(absl::string_view)>& on_chunk) override {
    {
      absl::MutexLock lock(&mu_);
      ++fetches_;
    }
    return inner_->FetchArtifact(id, timeout, on_chunk);
  }
  int fetches() {
    absl::MutexLock lock(&mu_);
    return fetches_;
  }

 private:
  worker::ArtifactSource* inner_;
  absl::Mutex mu_;
  int fetches_ = 0;
};

using WorkerArtifactCache = InProcessCoordinator;

TEST_F(WorkerArtifactCache, FetchesOnceAndThenServesFromTheCache) {
  const std::string bytes = RandomBytes(3 * kChunk + 5, 9);
  UploadResult up = Upload(stub_.get(), Messages("train.pt", bytes, Sha256Hex(bytes)));
  ASSERT_TRUE(up.status.ok()) << up.status.error_message();

  worker::CoordinatorClient client(address_);
  CountingSource source(&client);
  worker::ArtifactCacheOptions options;
  options.dir = dir_.path() + "/cache";
  options.fetch_timeout = absl::Seconds(30);
  auto cache = worker::ArtifactCache::Open(options, &source);
  ASSERT_TRUE(cache.ok()) << cache.status();

  auto path = (*cache)->Resolve(up.response.uri());
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, options.dir + "/" + up.response.artifact_id());
  EXPECT_TRUE(ReadAll(*path) == bytes);
  EXPECT_EQ(source.fetches(), 1);

  auto again = (*cache)->Resolve(up.response.uri());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *path);
  EXPECT_EQ(source.fetches(), 1) << "the second resolve fetched again";

  // The resolver the task runner gets behaves the same; plain paths pass through unchanged.
  runtime::FileResolver resolve = (*cache)->Resolver();
  EXPECT_EQ(resolve(up.response.uri()).value_or(""), *path);
  EXPECT_EQ(resolve("/shared/volume/train.pt").value_or(""), "/shared/volume/train.pt");
  EXPECT_EQ(source.fetches(), 1);
  // Only the artifact is in the cache directory (no temporary files left).
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(options.dir)) {
    files.push_back(e.path().filename().string());
  }
  EXPECT_THAT(files, ::testing::ElementsAre(up.response.artifact_id()));
}

TEST_F(WorkerArtifactCache, ConcurrentResolvesOfOneArtifactFetchItOnce) {
  const std::string bytes = RandomBytes(4 * kChunk, 10);
  UploadResult up = Upload(stub_.get(), Messages("model.pt", bytes, Sha256Hex(bytes)));
  ASSERT_TRUE(up.status.ok()) << up.status.error_message();
  worker::CoordinatorClient client(address_);
  CountingSource source(&client);
  auto cache = worker::ArtifactCache::Open({dir_.path() + "/cache", absl::Seconds(30)}, &source);
  ASSERT_TRUE(cache.ok()) << cache.status();
  std::vector<absl::StatusOr<std::string>> results(6);
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] { results[t] = (*cache)->Resolve(up.response.uri()); });
  }
  for (auto& t : threads) t.join();
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(*r, *results[0]);
  }
  EXPECT_EQ(source.fetches(), 1);
  EXPECT_TRUE(ReadAll(*results[0]) == bytes);
}

TEST_F(WorkerArtifactCache, UnknownAndMalformedReferencesNameTheReference) {
  worker::CoordinatorClient client(address_);
  auto cache = worker::ArtifactCache::Open({dir_.path() + "/cache", absl::Seconds(30)}, &client);
  ASSERT_TRUE(cache.ok()) << cache.status();
  const std::string uri = "artifact:" + Sha256Hex("never uploaded");
  auto missing = (*cache)->Resolve(uri);
  ASSERT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  EXPECT_THAT(missing.status().message(), HasSubstr(uri));
  EXPECT_FALSE(fs::exists(dir_.path() + "/cache/" + Sha256Hex("never uploaded")));
  EXPECT_TRUE(fs::is_empty(dir_.path() + "/cache")) << "a failed fetch left a file behind";

  auto malformed = (*cache)->Resolve("artifact:1234");
  ASSERT_EQ(malformed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(malformed.status().message(), HasSubstr("artifact:1234"));
}

TEST(WorkerArtifactCacheNoCoordinator, UnreachableCoordinatorFailsWithinTheTimeout) {
  TempDir dir;
  worker::CoordinatorClient client("127.0.0.1:1");  // nothing listens there
  auto cache = worker::ArtifactCache::Open({dir.path() + "/cache", absl::Seconds(3)}, &client);
  ASSERT_TRUE(cache.ok()) << cache.status();
  const absl::Time start = absl::Now();
  const std::string uri = "artifact:" + Sha256Hex("x");
  auto r = (*cache)->Resolve(uri);
  EXPECT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr(uri));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST(WorkerArtifactCacheNoCoordinator, DefaultDirectoryIsPrivateAndRemoved) {
  worker::CoordinatorClient client("127.0.0.1:1");
  auto cache = worker::ArtifactCache::Open({}, &client);
  ASSERT_TRUE(cache.ok()) << cache.status();
  const std::string dir = (*cache)->dir();
  EXPECT_TRUE(fs::is_directory(dir));
  cache->reset();
  EXPECT_FALSE(fs::exists(dir));
}

// --- uploaded data on real worker processes ---

// A dataset uploaded with --data trains on worker processes that cannot see the file: the
// workers fetch it from the coordinator, and the losses equal those of the same job reading
// the file from a path the workers do see. A spec naming an artifact the coordinator does not
// hold fails, naming data.path and the uri.
TEST(UploadedData, WorkersFetchItAndTrainAsOnTheirOwnPath) {
  if (!PythonHasTorch()) GTEST_SKIP() << "/usr/bin/python3 cannot import torch";
  ClusterOptions options;
  options.workers = 2;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string data = (*cluster)->dir() + "/train.pt";
  ASSERT_EQ(std::system(absl::StrCat("/usr/bin/python3 -c 'import torch; g = "
                                     "torch.Generator().manual_seed(5); X = torch.randn(10, 8, "
                                     "generator=g); torch.save({\"inputs\": X, \"targets\": "
                                     "torch.tanh(X[:, :3])}, \"",
                                     data, "\")'")
                            .c_str()),
            0);
  const std::string uploaded =
      (*cluster)->WriteFile("uploaded.yaml", TensorsSpec("/not/on/any/worker.pt"));
  CommandResult first = (*cluster)->Stagectl({"submit", uploaded, "--data", data, "--wait"});
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err << (*cluster)->Logs();
  EXPECT_THAT(first.err, HasSubstr("as artifact:" + Sha256Hex(ReadAll(data))));
  auto with_upload = (*cluster)->GetJob(LastLine(first.out));
  ASSERT_TRUE(with_upload.ok()) << with_upload.status();

  const std::string local = (*cluster)->WriteFile("local.yaml", TensorsSpec(data));
  CommandResult second = (*cluster)->Stagectl({"submit", local, "--wait"});
  ASSERT_EQ(second.exit_code, 0) << second.out << second.err;
  auto with_path = (*cluster)->GetJob(LastLine(second.out));
  ASSERT_TRUE(with_path.ok()) << with_path.status();

  ASSERT_EQ(with_upload->losses_size(), 2);
  ASSERT_EQ(with_path->losses_size(), 2);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(with_upload->losses(i), with_path->losses(i)) << i;

  const std::string unknown = "artifact:" + Sha256Hex("not uploaded");
  const std::string dangling = (*cluster)->WriteFile("dangling.yaml", TensorsSpec(unknown));
  CommandResult third = (*cluster)->Stagectl({"submit", dangling});
  ASSERT_EQ(third.exit_code, 0) << third.err;
  auto failed = (*cluster)->WaitForJob(LastLine(third.out), IsFinal, absl::Seconds(60));
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ(failed->state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed->reason(), HasSubstr("data.path"));
  EXPECT_THAT(failed->reason(), HasSubstr(unknown));
}

// A TorchScript model uploaded with --model (and its data with --data) runs on worker processes
// that see neither file: they fetch both from the coordinator (the model already for planning's
// InspectModel).
TEST(UploadedModel, WorkersFetchItAndTrain) {
  if (!PythonHasTorch()) GTEST_SKIP() << "/usr/bin/python3 cannot import torch";
  ClusterOptions options;
  options.workers = 2;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string model = (*cluster)->dir() + "/model.pt";
  const std::string data = (*cluster)->dir() + "/train.pt";
  ASSERT_EQ(
      std::system(absl::StrCat("/usr/bin/python3 -c 'import torch; torch.manual_seed(3); "
                               "m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), "
                               "torch.nn.Linear(16, 3)); torch.jit.save(torch.jit.script(m), \"",
                               model,
                               "\"); X = torch.randn(10, 8); torch.save({\"inputs\": X, "
                               "\"targets\": torch.tanh(X[:, :3])}, \"",
                               data, "\")'")
                      .c_str()),
      0);
  std::string spec_text = TorchScriptSpec("/not/on/any/worker.pt");
  const std::string spec = (*cluster)->WriteFile("job.yaml", spec_text);
  CommandResult r =
      (*cluster)->Stagectl({"submit", spec, "--model", model, "--data", data, "--wait"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err << (*cluster)->Logs();
  const std::string model_uri = "artifact:" + Sha256Hex(ReadAll(model));
  const std::string data_uri = "artifact:" + Sha256Hex(ReadAll(data));
  EXPECT_THAT(r.err, HasSubstr("as " + model_uri));
  EXPECT_THAT(r.err, HasSubstr("as " + data_uri));
  auto job = (*cluster)->GetJob(LastLine(r.out));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->reason();
  auto parsed = spec::ParseJobSpec(job->spec_yaml(), "submitted");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->model.torchscript.value_or(""), model_uri);
  EXPECT_EQ(parsed->data.path, data_uri);
  ASSERT_EQ(job->losses_size(), 2);
  for (double loss : job->losses()) EXPECT_TRUE(std::isfinite(loss) && loss > 0) << loss;
}

}  // namespace
}  // namespace stagecoach::testing::artifact_upload_test
