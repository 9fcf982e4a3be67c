#include "coordinator/generation/pipeline_decoder.h"

#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/rpc/tensor_data.h"
#include "common/util/logging.h"
#include "common/util/status_macros.h"

namespace stagecoach::coordinator {

PipelineDecoder::PipelineDecoder(DecodeCall decode, DecodeRoute route, std::string session,
                                 int64_t rows, int64_t max_positions, int64_t vocab)
    : decode_(std::move(decode)),
      route_(std::move(route)),
      session_(std::move(session)),
      rows_(rows),
      max_positions_(max_positions),
      vocab_(vocab) {}

PipelineDecoder::~PipelineDecoder() {
  v1::DecodeRequest end;
  end.set_job_id(route_.job_id);
  end.set_attempt(route_.attempt);
  end.set_session(session_);
  end.set_end_session(true);
  for (const std::string& address :
       std::set<std::string>(route_.stage_addresses.begin(), route_.stage_addresses.end())) {
    absl::StatusOr<v1::DecodeResponse> ended = decode_(address, end, absl::Seconds(5));
    if (!ended.ok()) {
      spdlog::warn("generation session {} of {}: could not end it on the worker at {}: {}",
                   session_, route_.job_id, address, ended.status().ToString());
    }
  }
}

absl::StatusOr<std::vector<std::vector<float>>> PipelineDecoder::Step(
    const std::vector<int64_t>& rows, const std::vector<int64_t>& starts,
    const std::vector<std::vector<int32_t>>& tokens, absl::Time deadline) {
  v1::DecodeRequest request;
  request.set_job_id(route_.job_id);
  request.set_attempt(route_.attempt);
  request.set_session(session_);
  request.set_session_rows(static_cast<int32_t>(rows_));
  request.set_max_positions(max_positions_);
  for (int64_t r : rows) request.add_rows(static_cast<int32_t>(r));
  for (int64_t s : starts) request.add_starts(s);
  *request.mutable_inputs() = TokenRows(tokens);
  const int stages = static_cast<int>(route_.stage_addresses.size());
  for (int s = 0; s < stages; ++s) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat("generate on job ", route_.job_id, ": out of time at stage ", s));
    }
    const std::string& address = route_.stage_addresses[s];
    request.set_stage(s);
    request.set_last_position_only(s == stages - 1);
    absl::StatusOr<v1::DecodeResponse> out = decode_(address, request, left);
    if (!out.ok()) {
      return absl::Status(out.status().code(),
                          absl::StrCat("job ", route_.job_id, " stage ", s, " (worker at ",
                                       address, "): ", out.status().message()));
    }
    cache_bytes_[address] = out->cache_bytes();
    *request.mutable_inputs() = std::move(*out->mutable_outputs());
  }
  return RowLogits(request.inputs(), static_cast<int64_t>(rows.size()), vocab_, route_.job_id);
}

int64_t PipelineDecoder::cache_bytes() const {
  int64_t total = 0;
  for (const auto& [address, bytes] : cache_bytes_) total += bytes;
  return total;
}

v1::TensorData TokenRows(const std::vector<std::vector<int32_t>>& tokens) {
  v1::TensorData out;
  out.set_dtype("int64");
  out.add_shape(static_cast<int64_t>(tokens.size()));
  out.add_shape(tokens.empty() ? 0 : static_cast<int64_t>(tokens[0].size()));
  std::string bytes;
  for (const std::vector<int32_t>& row : tokens) {
    for (int32_t t : row) {
      const int64_t v = t;
      bytes.append(reinterpret_cast<const char*>(&v), sizeof(v));
    }
  }
  out.set_data(std::move(bytes));
  return out;
}

absl::StatusOr<std::vector<std::vector<float>>> RowLogits(const v1::TensorData& outputs,
                                                          int64_t rows, int64_t vocab,
                                                          const std::string& job_id) {
  RETURN_IF_ERROR(rpc::ValidateTensorData(outputs, "outputs"));
  if (outputs.dtype() != "float32" || outputs.shape_size() != 2 || outputs.shape(0) != rows ||
      outputs.shape(1) != vocab) {
    return absl::InternalError(absl::StrCat("job ", job_id, "'s last stage returned ",
                                            rpc::DescribeTensorData(outputs),
                                            ", not float32 logits [", rows, ", ", vocab, "]"));
  }
  std::vector<std::vector<float>> out(rows, std::vector<float>(vocab));
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(out[r].data(), outputs.data().data() + r * vocab * 4, vocab * 4);
  }
  return out;
}

}  // namespace stagecoach::coordinator
