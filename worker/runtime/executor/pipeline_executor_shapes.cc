// PipelineExecutor::AgreeShapes: every boundary's shapes, agreed with the other ranks before the
// first step (see pipeline_executor.h, "Shapes").
#include <torch/torch.h>

#include <set>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/util/status_macros.h"
#include "worker/runtime/executor/message_tags.h"
#include "worker/runtime/executor/pipeline_executor.h"
#include "worker/runtime/executor/pipeline_executor_state.h"
#include "worker/runtime/executor/side_effect_guard.h"

namespace stagecoach::runtime {
namespace {

using executor_internal::GuardTorch;
using executor_internal::MetaOf;

// A TensorMeta on the wire: [dtype, requires_grad, ndim, d0 .. d(kMaxDims-1)].
constexpr int kMaxDims = 8;
constexpr int kMetaWords = 3 + kMaxDims;

std::string MetasToString(const std::vector<TensorMeta>& metas) {
  std::vector<std::string> parts;
  for (const TensorMeta& m : metas) parts.push_back(m.ToString());
  return absl::StrJoin(parts, ", ");
}

}  // namespace

// The shape messages this rank posted; AgreeShapes waits for them at its end.
struct PipelineExecutor::ShapeSends {
  std::vector<torch::Tensor> buffers;
  std::vector<std::pair<int, std::unique_ptr<transport::Work>>> works;  // peer, work
};

absl::Status PipelineExecutor::AgreeShapes(const std::vector<TensorMeta>& first_stage_inputs) {
  RETURN_IF_ERROR(CheckWiring());
  ShapeSends sends;
  for (const auto& [s, model] : stages_) {
    const std::string where =
        absl::StrCat("rank ", options_.rank, ", agreeing shapes of stage ", s);
    std::vector<std::vector<TensorMeta>> in;
    RETURN_IF_ERROR(InputMetas(s, first_stage_inputs, where, in));
    std::vector<std::vector<TensorMeta>> out;
    RETURN_IF_ERROR(OutputMetas(s, in, where, out));
    input_meta_[s] = in;
    output_meta_[s] = out;
    RETURN_IF_ERROR(SendOutputMetas(s, where, sends));
  }
  for (auto& [peer, work] : sends.works) {
    absl::Status sent = work->Wait(options_.comm_timeout);
    if (!sent.ok()) {
      return absl::Status(
          sent.code(), absl::StrCat("rank ", options_.rank, ": sending shapes to rank ", peer, ": ",
                                    sent.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status PipelineExecutor::CheckWiring() const {
  const int num_stages = options_.num_stages;
  if (static_cast<int>(options_.wiring.size()) != num_stages) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", options_.rank, ": the wiring has ",
                                                   options_.wiring.size(), " stages, expected ",
                                                   num_stages));
  }
  for (int c = 0; c < num_stages; ++c) {
    for (size_t i = 0; i < options_.wiring[c].inputs.size(); ++i) {
      const model::ValueSource& src = options_.wiring[c].inputs[i];
      const bool ok = src.stage == -1 ? c == 0
                                      : src.stage >= 0 && src.stage < c && src.index >= 0 &&
                                            src.index < options_.wiring[src.stage].num_outputs;
      if (!ok) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rank ", options_.rank, ": input ", i, " of stage ", c, " comes from output ",
            src.index, " of stage ", src.stage, ", which is not an earlier stage's output"));
      }
    }
  }
  if (options_.wiring[num_stages - 1].num_outputs != 1) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", options_.rank, ": the last stage has ",
                                                   options_.wiring[num_stages - 1].num_outputs,
                                                   " outputs; it must have one, the model's"));
  }
  return absl::OkStatus();
}

absl::Status PipelineExecutor::InputMetas(int s, const std::vector<TensorMeta>& first_stage_inputs,
                                          const std::string& where,
                                          std::vector<std::vector<TensorMeta>>& in) {
  const int m = options_.num_microbatches;
  const size_t n_in = options_.wiring[s].inputs.size();
  in.assign(m, std::vector<TensorMeta>(n_in));
  std::set<int> received_from;  // producers whose pair message has been received
  for (size_t i = 0; i < n_in; ++i) {
    const int e = edges_into_[s][i];
    if (e < 0) {
      if (static_cast<int>(first_stage_inputs.size()) != m) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": expected ", m, " microbatch input shapes, got ", first_stage_inputs.size()));
      }
      for (int mb = 0; mb < m; ++mb) {
        in[mb][i] = first_stage_inputs[mb];
        in[mb][i].requires_grad = false;
      }
      continue;
    }
    const int p = edges_[e].producer;
    if (Local(p)) {
      for (int mb = 0; mb < m; ++mb) in[mb][i] = output_meta_.at(p)[mb][edges_[e].output];
      continue;
    }
    if (!received_from.insert(p).second) continue;
    RETURN_IF_ERROR(ReceivePairMetas(p, s, where, in));
  }
  return absl::OkStatus();
}

absl::Status PipelineExecutor::ReceivePairMetas(int p, int s, const std::string& where,
                                                std::vector<std::vector<TensorMeta>>& in) {
  const int m = options_.num_microbatches;
  // The pair message: every value p sends s, in edge order, for every microbatch.
  std::vector<int> pair;
  for (size_t f = 0; f < edges_.size(); ++f) {
    if (edges_[f].producer == p && edges_[f].consumer == s) pair.push_back(static_cast<int>(f));
  }
  const int peer = RankOf(p);
  const int64_t words_per_mb = static_cast<int64_t>(pair.size()) * kMetaWords;
  // Shape messages are int64 words in memory the transport moves (device memory for NCCL).
  torch::Tensor received = torch::empty(
      {m * words_per_mb}, torch::TensorOptions(torch::kInt64).device(TransferDevice()));
  ASSIGN_OR_RETURN(auto work, transport_->Recv(received.data_ptr(), received.nbytes(), peer,
                                               MessageTag(Payload::kShapes, PairEdge(p, s), 0)));
  absl::Status waited = work->Wait(options_.comm_timeout);
  if (!waited.ok()) {
    return absl::Status(waited.code(),
                        absl::StrCat(where, ": waiting for the shapes of stage ", p,
                                     "'s output from rank ", peer, ": ", waited.message()));
  }
  const torch::Tensor words = received.to(torch::kCPU);
  for (int mb = 0; mb < m; ++mb) {
    for (size_t j = 0; j < pair.size(); ++j) {
      const int64_t* w =
          words.data_ptr<int64_t>() + mb * words_per_mb + static_cast<int64_t>(j) * kMetaWords;
      const int64_t ndim = w[2];
      if (w[0] < 0 || w[0] >= static_cast<int64_t>(torch::ScalarType::NumOptions) || ndim < 0 ||
          ndim > kMaxDims) {
        return absl::DataLossError(absl::StrCat(where, ": malformed shape message from rank ", peer,
                                                " for microbatch ", mb));
      }
      TensorMeta meta{std::vector<int64_t>(w + 3, w + 3 + ndim),
                      static_cast<torch::ScalarType>(w[0])};
      meta.requires_grad = w[1] != 0;
      in[mb][edges_[pair[j]].input] = std::move(meta);
    }
  }
  return absl::OkStatus();
}

absl::Status PipelineExecutor::OutputMetas(int s, const std::vector<std::vector<TensorMeta>>& in,
                                           const std::string& where,
                                           std::vector<std::vector<TensorMeta>>& out) {
  const int m = options_.num_microbatches;
  out.assign(m, {});
  for (int mb = 0; mb < m; ++mb) {
    // Microbatches of one shape have one output shape: infer each distinct shape once.
    int same = -1;
    for (int j = 0; j < mb; ++j) {
      if (in[j] == in[mb]) same = j;
    }
    if (same >= 0) {
      out[mb] = out[same];
      continue;
    }
    std::string from;
    if (IsChain(options_.wiring)) {
      from = absl::StrCat(
          " (input ", in[mb][0].ToString(), " from ",
          s == 0 ? std::string("the batch") : absl::StrCat("stage ", s - 1, "'s output"), ")");
    } else {
      from = absl::StrCat(" (inputs ", MetasToString(in[mb]), ")");
    }
    RETURN_IF_ERROR(
        GuardTorch(absl::StrCat(where, ", microbatch ", mb, from), [&]() -> absl::Status {
          // Training probes record autograd, to learn which outputs carry a gradient back (the
          // graph is dropped with the probe's values). The probe leaves no trace on the stage.
          torch::AutoGradMode grad_mode(!options_.forward_only);
          // A sharded stage probes with placeholder parameters of their shapes.
          const std::function<void()> release = options_.sharding != nullptr
                                                    ? options_.sharding->Placeholders(s)
                                                    : std::function<void()>([] {});
          const absl::Cleanup put_back = [&release] { release(); };
          SideEffectGuard no_trace(*stages_.at(s), options_.device);
          std::vector<torch::Tensor> probes;
          for (const TensorMeta& meta : in[mb]) {
            torch::Tensor t =
                torch::zeros(meta.shape, torch::TensorOptions(meta.dtype).device(options_.device));
            if (meta.requires_grad && !options_.forward_only && t.is_floating_point()) {
              t.requires_grad_(true);
            }
            probes.push_back(std::move(t));
          }
          std::vector<torch::Tensor> values = RunStage(s, probes);
          if (static_cast<int>(values.size()) != options_.wiring[s].num_outputs) {
            return absl::InvalidArgumentError(
                absl::StrCat("the stage returned ", values.size(), " values, but its wiring has ",
                             options_.wiring[s].num_outputs, " outputs"));
          }
          for (const torch::Tensor& v : values) {
            TensorMeta meta = MetaOf(v);
            meta.requires_grad = !options_.forward_only && v.requires_grad();
            out[mb].push_back(std::move(meta));
          }
          return absl::OkStatus();
        }));
  }
  return absl::OkStatus();
}

absl::Status PipelineExecutor::SendOutputMetas(int s, const std::string& where, ShapeSends& sends) {
  const int m = options_.num_microbatches;
  const std::vector<std::vector<TensorMeta>>& out = output_meta_.at(s);
  // One pair message to each consumer stage on another rank.
  std::map<int, std::vector<int>> pairs;  // consumer -> edges, in edge order
  for (size_t f = 0; f < edges_.size(); ++f) {
    if (edges_[f].producer == s && !Local(edges_[f].consumer)) {
      pairs[edges_[f].consumer].push_back(static_cast<int>(f));
    }
  }
  for (const auto& [c, pair] : pairs) {
    const int64_t words_per_mb = static_cast<int64_t>(pair.size()) * kMetaWords;
    torch::Tensor words = torch::zeros({m * words_per_mb}, torch::kInt64);
    for (int mb = 0; mb < m; ++mb) {
      for (size_t j = 0; j < pair.size(); ++j) {
        const TensorMeta& meta = out[mb][edges_[pair[j]].output];
        if (meta.shape.size() > kMaxDims) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": output has more than ", kMaxDims, " dimensions"));
        }
        int64_t* w =
            words.data_ptr<int64_t>() + mb * words_per_mb + static_cast<int64_t>(j) * kMetaWords;
        w[0] = static_cast<int64_t>(meta.dtype);
        w[1] = meta.requires_grad ? 1 : 0;
        w[2] = static_cast<int64_t>(meta.shape.size());
        for (size_t d = 0; d < meta.shape.size(); ++d) w[3 + d] = meta.shape[d];
      }
    }
    const torch::Tensor& sent = sends.buffers.emplace_back(words.to(TransferDevice()));
    const int peer = RankOf(c);
    ASSIGN_OR_RETURN(auto work, transport_->Send(sent.data_ptr(), sent.nbytes(), peer,
                                                 MessageTag(Payload::kShapes, PairEdge(s, c), 0)));
    sends.works.emplace_back(peer, std::move(work));
  }
  return absl::OkStatus();
}

}  // namespace stagecoach::runtime
