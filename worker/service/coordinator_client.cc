#include "worker/service/coordinator_client.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "common/rpc/channel.h"
#include "common/rpc/status_conversion.h"
#include "common/rpc/time_conversion.h"
#include "common/util/status_macros.h"

namespace stagecoach::worker {
CoordinatorClient::CoordinatorClient(const std::string& address,
                                     const rpc::ChannelSecurity& security)
    : address_(address),
      peer_(absl::StrCat("coordinator ", address)),
      stub_(v1::CoordinatorService::NewStub(rpc::MakeChannel(address, security))) {}

absl::StatusOr<v1::RegisterWorkerResponse> CoordinatorClient::Register(
    const v1::RegisterWorkerRequest& req) {
  grpc::ClientContext ctx;
  rpc::SetDeadline(&ctx, kCallTimeout);
  v1::RegisterWorkerResponse resp;
  grpc::Status status = stub_->RegisterWorker(&ctx, req, &resp);
  if (!status.ok()) return rpc::CallError(status, "RegisterWorker", peer_);
  return resp;
}

absl::StatusOr<v1::HeartbeatResponse> CoordinatorClient::Heartbeat(
    const v1::HeartbeatRequest& request) {
  grpc::ClientContext ctx;
  rpc::SetDeadline(&ctx, kCallTimeout);
  v1::HeartbeatResponse resp;
  RETURN_IF_ERROR(rpc::CallError(stub_->Heartbeat(&ctx, request, &resp), "Heartbeat", peer_));
  return resp;
}

absl::Status CoordinatorClient::ReportStep(const v1::ReportStepRequest& report) {
  grpc::ClientContext ctx;
  rpc::SetDeadline(&ctx, kCallTimeout);
  v1::ReportStepResponse resp;
  return rpc::CallError(stub_->ReportStep(&ctx, report, &resp), "ReportStep", peer_);
}

absl::Status CoordinatorClient::ReportTaskEnd(const v1::ReportTaskEndRequest& report) {
  grpc::ClientContext ctx;
  rpc::SetDeadline(&ctx, kCallTimeout);
  v1::ReportTaskEndResponse resp;
  return rpc::CallError(stub_->ReportTaskEnd(&ctx, report, &resp), "ReportTaskEnd", peer_);
}

absl::StatusOr<v1::SettleStepResponse> CoordinatorClient::SettleStep(
    const v1::SettleStepRequest& request) {
  grpc::ClientContext ctx;
  rpc::SetDeadline(&ctx, rpc::FromProtoDuration(request.wait()) + kCallTimeout);
  v1::SettleStepResponse resp;
  RETURN_IF_ERROR(rpc::CallError(stub_->SettleStep(&ctx, request, &resp), "SettleStep", peer_));
  return resp;
}

absl::Status CoordinatorClient::ReportSnapshot(const v1::ReportSnapshotRequest& request) {
  grpc::ClientContext ctx;
  rpc::SetDeadline(&ctx, kCallTimeout);
  v1::ReportSnapshotResponse resp;
  return rpc::CallError(stub_->ReportSnapshot(&ctx, request, &resp), "ReportSnapshot", peer_);
}

absl::Status CoordinatorClient::Set(const std::string& key, const std::string& value) {
  grpc::ClientContext ctx;
  rpc::SetDeadline(&ctx, kCallTimeout);
  v1::SetKeyRequest req;
  req.set_key(key);
  req.set_value(value);
  v1::SetKeyResponse resp;
  return rpc::CallError(stub_->SetKey(&ctx, req, &resp), "SetKey", peer_);
}

absl::StatusOr<std::string> CoordinatorClient::Get(const std::string& key, absl::Duration timeout) {
  grpc::ClientContext ctx;
  rpc::SetDeadline(&ctx, timeout + kCallTimeout);
  v1::GetKeyRequest req;
  req.set_key(key);
  *req.mutable_wait() = rpc::ToProtoDuration(timeout);
  v1::GetKeyResponse resp;
  grpc::Status status = stub_->GetKey(&ctx, req, &resp);
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return absl::DeadlineExceededError(status.error_message());  // the key is not there (yet)
  }
  if (!status.ok()) return rpc::CallError(status, "GetKey", peer_);
  return resp.value();
}

absl::Status CoordinatorClient::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  grpc::ClientContext ctx;
  rpc::SetDeadline(&ctx, timeout + kCallTimeout);
  v1::WaitKeysRequest req;
  for (const auto& k : keys) req.add_keys(k);
  *req.mutable_wait() = rpc::ToProtoDuration(timeout);
  v1::WaitKeysResponse resp;
  grpc::Status status = stub_->WaitKeys(&ctx, req, &resp);
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return absl::DeadlineExceededError(status.error_message());
  }
  return rpc::CallError(status, "WaitKeys", peer_);
}

absl::StatusOr<v1::ArtifactHeader> CoordinatorClient::FetchArtifact(
    const std::string& id, absl::Duration timeout,
    const std::function<absl::Status(absl::string_view chunk)>& on_chunk) {
  grpc::ClientContext ctx;
  rpc::SetDeadline(&ctx, timeout);
  v1::FetchArtifactRequest req;
  req.set_artifact_id(id);
  auto reader = stub_->FetchArtifact(&ctx, req);
  v1::FetchArtifactResponse msg;
  std::optional<v1::ArtifactHeader> header;
  absl::Status failed;
  while (failed.ok() && reader->Read(&msg)) {
    if (!header.has_value()) {
      if (!msg.has_header()) {
        failed = absl::InvalidArgumentError(
            absl::StrCat("FetchArtifact on ", peer_, ": the first message carries no header"));
      } else {
        header = msg.header();
      }
    } else if (msg.part_case() != v1::FetchArtifactResponse::kChunk) {
      failed = absl::InvalidArgumentError(
          absl::StrCat("FetchArtifact on ", peer_, ": a message after the header is no chunk"));
    } else {
      failed = on_chunk(msg.chunk());
    }
  }
  if (!failed.ok()) {
    ctx.TryCancel();
    reader->Finish();
    return failed;
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) return rpc::CallError(status, "FetchArtifact", peer_);
  if (!header.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("FetchArtifact on ", peer_, ": the stream ended without a header"));
  }
  return *std::move(header);
}

}  // namespace stagecoach::worker
