#include "worker/runtime/generation/decode_sessions.h"

#include <torch/torch.h>

#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/util/status_macros.h"
#include "worker/model/layer_chain.h"

namespace stagecoach::runtime {
namespace {

std::string Shape(const torch::Tensor& t) { return absl::StrJoin(t.sizes().vec(), ", "); }

// The request's own checks, before any session is touched.
absl::Status CheckRequest(const DecodeStepRequest& r) {
  if (r.session.empty()) return absl::InvalidArgumentError("session: required");
  if (r.session_rows < 1 || r.session_rows > DecodeSessions::kMaxRows) {
    return absl::InvalidArgumentError(absl::StrCat("session_rows: must be in [1, ",
                                                   DecodeSessions::kMaxRows, "], got ",
                                                   r.session_rows));
  }
  if (r.max_positions < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_positions: must be >= 1, got ", r.max_positions));
  }
  if (r.rows.empty() || r.rows.size() != r.starts.size()) {
    return absl::InvalidArgumentError(absl::StrCat("rows, starts: need one start per row (",
                                                   r.rows.size(), " rows, ", r.starts.size(),
                                                   " starts), at least one row"));
  }
  std::set<int64_t> seen;
  for (int64_t row : r.rows) {
    if (row < 0 || row >= r.session_rows || !seen.insert(row).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rows: row ", row, " is repeated or outside the session's ", r.session_rows, " rows"));
    }
  }
  if (!r.inputs.defined() || r.inputs.dim() < 2 ||
      r.inputs.size(0) != static_cast<int64_t>(r.rows.size()) || r.inputs.size(1) < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "inputs: expected [", r.rows.size(), " rows, T >= 1, ...], got [",
        r.inputs.defined() ? Shape(r.inputs) : std::string("none"), "]"));
  }
  const bool ids = r.inputs.scalar_type() == torch::kInt64;
  if ((r.stage == 0) != ids || (r.stage == 0 && r.inputs.dim() != 2) ||
      (!ids && !r.inputs.is_floating_point())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "inputs: stage ", r.stage, " takes ",
        r.stage == 0 ? "int64 token ids [rows, T]" : "the previous stage's float outputs",
        ", got ", std::string(c10::toString(r.inputs.scalar_type())), " [", Shape(r.inputs), "]"));
  }
  const int64_t t = r.inputs.size(1);
  for (size_t j = 0; j < r.rows.size(); ++j) {
    if (r.starts[j] < 0 || r.starts[j] + t > r.max_positions) {
      return absl::InvalidArgumentError(
          absl::StrCat("starts: row ", r.rows[j], " would run positions [", r.starts[j], ", ",
                       r.starts[j] + t, "), outside the session's ", r.max_positions,
                       " positions"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int64_t DecodeSessions::Session::Bytes() const {
  int64_t total = 0;
  for (const auto& [stage, kv] : caches) total += kv.bytes();
  return total;
}

absl::StatusOr<DecodeSessions::Session*> DecodeSessions::SessionFor(
    const DecodeStepRequest& r) {
  const absl::Time now = absl::Now();
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (it->first != r.session && now - it->second.last_used > idle_timeout_) {
      it = sessions_.erase(it);
    } else {
      ++it;
    }
  }
  auto [it, made] = sessions_.try_emplace(r.session);
  Session& s = it->second;
  if (made) {
    s.rows = r.session_rows;
    s.max_positions = r.max_positions;
  } else if (s.rows != r.session_rows || s.max_positions != r.max_positions) {
    return absl::InvalidArgumentError(absl::StrCat(
        "session_rows, max_positions: session ", r.session, " has ", s.rows, " rows of ",
        s.max_positions, " positions, not ", r.session_rows, " of ", r.max_positions));
  }
  s.last_used = now;
  auto [held, fresh] = s.held.try_emplace(r.stage, std::vector<int64_t>(s.rows, 0));
  for (size_t j = 0; j < r.rows.size(); ++j) {
    const int64_t has = held->second[r.rows[j]];
    if (r.starts[j] > has) {
      return absl::InvalidArgumentError(
          absl::StrCat("starts: row ", r.rows[j], " starts at position ", r.starts[j],
                       ", but stage ", r.stage, " holds only its first ", has, " positions"));
    }
  }
  return &s;
}

absl::StatusOr<DecodeStepResult> DecodeSessions::Run(const DecodeStepRequest& r,
                                                     model::StageModel& stage,
                                                     model::Precision precision,
                                                     const torch::Device& device) {
  RETURN_IF_ERROR(CheckRequest(r));
  auto* chain = dynamic_cast<model::LayerChainStage*>(&stage);
  if (chain == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "stage ", r.stage, " is not a built-in decoder's (gpt or llama): it has no cached decoding"));
  }
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Session * s, SessionFor(r));
  const int64_t t = r.inputs.size(1);
  const model::DecodePositions at =
      model::DecodePositions::Make(r.rows, r.starts, t, s->rows, s->max_positions, device);
  torch::Tensor out;
  try {
    torch::NoGradGuard no_grad;
    model::AutocastGuard autocast(precision, device);
    out = chain->ForwardCached(r.inputs.to(device), at, s->caches[r.stage]);
  } catch (const std::exception& e) {
    // The layers' checks (a token id outside the vocabulary, a width the stage does not take).
    return absl::InvalidArgumentError(
        absl::StrCat("inputs: stage ", r.stage, " cannot take [", Shape(r.inputs), "]: ",
                     e.what()));
  }
  std::vector<int64_t>& held = s->held[r.stage];
  for (size_t j = 0; j < r.rows.size(); ++j) held[r.rows[j]] = r.starts[j] + t;
  if (r.last_position_only) out = out.select(1, t - 1);
  DecodeStepResult result;
  result.outputs = out.to(torch::kCPU, torch::kFloat32).contiguous();
  result.cache_bytes = s->Bytes();
  return result;
}

void DecodeSessions::End(const std::string& session) {
  absl::MutexLock lock(&mu_);
  sessions_.erase(session);
}

void DecodeSessions::Clear() {
  absl::MutexLock lock(&mu_);
  sessions_.clear();
}

int64_t DecodeSessions::sessions() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(sessions_.size());
}

int64_t DecodeSessions::cache_bytes() const {
  absl::MutexLock lock(&mu_);
  int64_t total = 0;
  for (const auto& [name, s] : sessions_) total += s.Bytes();
  return total;
}

}  // namespace stagecoach::runtime
