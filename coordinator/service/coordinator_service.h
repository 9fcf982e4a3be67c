// The gRPC adapter of CoordinatorService: checks request fields, converts requests to
// JobManager / KvStore / ArtifactStore calls and their Status to grpc::Status. No logic of its
// own. Who may call which method is not its concern: the daemon serves it behind
// rpc::AuthorizeEveryCall with CoordinatorCallCheck (coordinator_auth.h).
#pragma once

#include <string>
#include <utility>

#include "coordinator/job_manager.h"
#include "coordinator/service/artifact_store.h"
#include "coordinator/service/coordinator_auth.h"
#include "coordinator/workers/kv_store.h"
#include "stagecoach/v1/coordinator.grpc.pb.h"

namespace stagecoach::coordinator {

class CoordinatorServiceImpl final : public v1::CoordinatorService::Service {
 public:
  // Longest a single GetKey / WaitKeys call may block, whatever the client asks.
  static constexpr absl::Duration kMaxKvWait = absl::Minutes(5);
  // How often a WatchJob stream checks whether its client went away.
  static constexpr absl::Duration kWatchPoll = absl::Milliseconds(500);
  // How long Infer waits for its job when the request gives no timeout, and at most.
  static constexpr absl::Duration kDefaultInferTimeout = absl::Minutes(5);
  static constexpr absl::Duration kMaxInferTimeout = absl::Hours(24);
  // The same for StepJob.
  static constexpr absl::Duration kDefaultStepTimeout = absl::Minutes(5);
  static constexpr absl::Duration kMaxStepTimeout = absl::Hours(24);

  // Artifacts are sent and received in chunks of this many bytes (the last may be shorter).
  static constexpr int kArtifactChunkBytes = 1 << 20;

  // Bounds on request fields the coordinator stores or looks up (INVALID_ARGUMENT naming the
  // field beyond them).
  static constexpr size_t kMaxIdBytes = 256;         // job, worker and artifact ids
  static constexpr size_t kMaxNameBytes = 256;       // worker names, spec origins
  static constexpr size_t kMaxAddressBytes = 512;    // worker addresses (host:port)
  static constexpr size_t kMaxKeyBytes = 1024;       // rendezvous store keys
  static constexpr size_t kMaxPathBytes = 4096;      // file paths (PATH_MAX)
  static constexpr size_t kMaxSpecBytes = 8 << 20;   // spec_yaml
  static constexpr size_t kMaxTextBytes = 64 << 10;  // reasons, free text

  // `artifacts` may be null: UploadArtifact / FetchArtifact then answer FAILED_PRECONDITION.
  CoordinatorServiceImpl(JobManager* jobs, KvStore* kv, ArtifactStore* artifacts = nullptr)
      : jobs_(jobs), kv_(kv), artifacts_(artifacts) {}

  grpc::Status SubmitJob(grpc::ServerContext* ctx, const v1::SubmitJobRequest* req,
                         v1::SubmitJobResponse* resp) override;
  grpc::Status GetJob(grpc::ServerContext* ctx, const v1::GetJobRequest* req,
                      v1::GetJobResponse* resp) override;
  grpc::Status PlanSpec(grpc::ServerContext* ctx, const v1::PlanSpecRequest* req,
                        v1::PlanSpecResponse* resp) override;
  grpc::Status DescribeModel(grpc::ServerContext* ctx, const v1::DescribeModelRequest* req,
                             v1::DescribeModelResponse* resp) override;
  grpc::Status ListJobs(grpc::ServerContext* ctx, const v1::ListJobsRequest* req,
                        v1::ListJobsResponse* resp) override;
  grpc::Status WatchJob(grpc::ServerContext* ctx, const v1::WatchJobRequest* req,
                        grpc::ServerWriter<v1::JobEvent>* writer) override;
  grpc::Status CancelJob(grpc::ServerContext* ctx, const v1::CancelJobRequest* req,
                         v1::CancelJobResponse* resp) override;
  grpc::Status CheckpointJob(grpc::ServerContext* ctx, const v1::CheckpointJobRequest* req,
                             v1::CheckpointJobResponse* resp) override;
  grpc::Status ListWorkers(grpc::ServerContext* ctx, const v1::ListWorkersRequest* req,
                           v1::ListWorkersResponse* resp) override;
  grpc::Status Infer(grpc::ServerContext* ctx, const v1::InferRequest* req,
                     v1::InferResponse* resp) override;
  grpc::Status PauseJob(grpc::ServerContext* ctx, const v1::PauseJobRequest* req,
                        v1::PauseJobResponse* resp) override;
  grpc::Status ResumeJob(grpc::ServerContext* ctx, const v1::ResumeJobRequest* req,
                         v1::ResumeJobResponse* resp) override;
  grpc::Status RunSteps(grpc::ServerContext* ctx, const v1::RunStepsRequest* req,
                        v1::RunStepsResponse* resp) override;
  grpc::Status StepJob(grpc::ServerContext* ctx, const v1::StepJobRequest* req,
                       v1::StepJobResponse* resp) override;
  grpc::Status GetJobSchedule(grpc::ServerContext* ctx, const v1::GetJobScheduleRequest* req,
                              v1::GetJobScheduleResponse* resp) override;
  grpc::Status GetStepTrace(grpc::ServerContext* ctx, const v1::GetStepTraceRequest* req,
                            v1::GetStepTraceResponse* resp) override;
  grpc::Status DiagnoseJob(grpc::ServerContext* ctx, const v1::DiagnoseJobRequest* req,
                           v1::DiagnoseJobResponse* resp) override;
  grpc::Status RegisterWorker(grpc::ServerContext* ctx, const v1::RegisterWorkerRequest* req,
                              v1::RegisterWorkerResponse* resp) override;
  grpc::Status Heartbeat(grpc::ServerContext* ctx, const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse* resp) override;
  grpc::Status ReportStep(grpc::ServerContext* ctx, const v1::ReportStepRequest* req,
                          v1::ReportStepResponse* resp) override;
  grpc::Status ReportTaskEnd(grpc::ServerContext* ctx, const v1::ReportTaskEndRequest* req,
                             v1::ReportTaskEndResponse* resp) override;
  grpc::Status SettleStep(grpc::ServerContext* ctx, const v1::SettleStepRequest* req,
                          v1::SettleStepResponse* resp) override;
  grpc::Status ReportSnapshot(grpc::ServerContext* ctx, const v1::ReportSnapshotRequest* req,
                              v1::ReportSnapshotResponse* resp) override;
  grpc::Status SetKey(grpc::ServerContext* ctx, const v1::SetKeyRequest* req,
                      v1::SetKeyResponse* resp) override;
  grpc::Status GetKey(grpc::ServerContext* ctx, const v1::GetKeyRequest* req,
                      v1::GetKeyResponse* resp) override;
  grpc::Status WaitKeys(grpc::ServerContext* ctx, const v1::WaitKeysRequest* req,
                        v1::WaitKeysResponse* resp) override;
  grpc::Status UploadArtifact(grpc::ServerContext* ctx,
                              grpc::ServerReader<v1::UploadArtifactRequest>* reader,
                              v1::UploadArtifactResponse* resp) override;
  grpc::Status FetchArtifact(grpc::ServerContext* ctx, const v1::FetchArtifactRequest* req,
                             grpc::ServerWriter<v1::FetchArtifactResponse>* writer) override;

 private:
  JobManager* jobs_;
  KvStore* kv_;
  ArtifactStore* artifacts_;
};

}  // namespace stagecoach::coordinator
