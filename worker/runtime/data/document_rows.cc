#include "worker/runtime/data/document_rows.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/runtime/executor/training_setup.h"

namespace stagecoach::runtime {

std::vector<DocumentSpan> SplitDocuments(const std::vector<int64_t>& tokens, int64_t eos) {
  std::vector<DocumentSpan> out;
  int64_t begin = 0;
  const int64_t n = static_cast<int64_t>(tokens.size());
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] != eos && i + 1 < n) continue;
    if (i + 1 - begin >= 2) out.push_back({begin, i + 1});
    begin = i + 1;
  }
  return out;
}

Batch DocumentRows(const std::vector<int64_t>& tokens, const std::vector<DocumentSpan>& documents,
                   int64_t eos, bool pack, int64_t rows, int64_t seq, uint64_t seed, int64_t step,
                   const std::vector<uint8_t>* counted) {
  const int64_t count = static_cast<int64_t>(documents.size());
  at::Generator gen = at::detail::createCPUGenerator(seed + 1 + static_cast<uint64_t>(step));
  const torch::Tensor first = torch::randint(0, count, {rows}, gen, torch::kInt64);
  Batch batch;
  batch.inputs = torch::full({rows, seq}, eos, torch::kInt64);
  batch.targets = torch::full({rows, seq}, kIgnoredTarget, torch::kInt64);
  batch.row_lengths = torch::zeros({rows}, torch::kInt64);
  if (pack) batch.segments = torch::full({rows, seq}, -1, torch::kInt64);
  int64_t* in = batch.inputs.data_ptr<int64_t>();
  int64_t* tg = batch.targets.data_ptr<int64_t>();
  int64_t* lengths = batch.row_lengths.data_ptr<int64_t>();
  int64_t* seg = pack ? batch.segments.data_ptr<int64_t>() : nullptr;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t used = 0;
    int64_t doc = first.data_ptr<int64_t>()[r];
    for (int64_t k = 0; k < count; ++k, doc = (doc + 1) % count) {
      const DocumentSpan& d = documents[doc];
      const int64_t positions = d.end - d.begin - 1;
      if (used > 0 && used + positions > seq) break;
      const int64_t take = std::min(positions, seq - used);
      std::copy_n(tokens.data() + d.begin, take, in + r * seq + used);
      std::copy_n(tokens.data() + d.begin + 1, take, tg + r * seq + used);
      if (counted != nullptr) {
        for (int64_t i = 0; i < take; ++i) {
          if ((*counted)[d.begin + 1 + i] == 0) tg[r * seq + used + i] = kIgnoredTarget;
        }
      }
      if (seg != nullptr) std::fill_n(seg + r * seq + used, take, k);
      used += take;
      if (!pack || used == seq) break;
    }
    lengths[r] = used;
  }
  return batch;
}

namespace {

class DocumentSource : public BatchSource {
 public:
  DocumentSource(const spec::JobSpec& spec, std::vector<int64_t> tokens,
                 std::vector<DocumentSpan> documents, std::vector<uint8_t> counted, int64_t eos,
                 bool want_inputs, bool want_targets, Records records)
      : records_(records),
        spec_(spec),
        tokens_(std::move(tokens)),
        documents_(std::move(documents)),
        counted_(std::move(counted)),
        eos_(eos),
        want_inputs_(want_inputs),
        want_targets_(want_targets) {}

  Records records() const override { return records_; }

  absl::StatusOr<Batch> Make(int64_t step) override {
    Batch batch = DocumentRows(tokens_, documents_, eos_, spec_.data.packing == "pack",
                               spec_.training.batch_size, WindowLength(spec_), spec_.data.seed,
                               step, counted_.empty() ? nullptr : &counted_);
    if (!want_inputs_) batch.inputs = torch::Tensor();
    if (!want_targets_) batch.targets = torch::Tensor();
    return batch;
  }

 private:
  Records records_;
  spec::JobSpec spec_;
  std::vector<int64_t> tokens_;
  std::vector<DocumentSpan> documents_;
  std::vector<uint8_t> counted_;
  int64_t eos_;
  bool want_inputs_;
  bool want_targets_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<BatchSource>> OpenDocumentSource(const spec::JobSpec& spec,
                                                                std::vector<int64_t> tokens,
                                                                int64_t eos, bool want_inputs,
                                                                bool want_targets) {
  std::vector<DocumentSpan> documents = SplitDocuments(tokens, eos);
  if (documents.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.path: '", spec.data.path, "' holds no document of two or more tokens (documents ",
        "end with the EOS id ", eos, "; data.eos or the model's eos_token_id)"));
  }
  return MakeDocumentSource(spec, std::move(tokens), std::move(documents), {}, eos, want_inputs,
                            want_targets);
}

std::unique_ptr<BatchSource> MakeDocumentSource(const spec::JobSpec& spec,
                                                std::vector<int64_t> tokens,
                                                std::vector<DocumentSpan> documents,
                                                std::vector<uint8_t> counted, int64_t pad,
                                                bool want_inputs, bool want_targets,
                                                BatchSource::Records records) {
  return std::unique_ptr<BatchSource>(new DocumentSource(spec, std::move(tokens),
                                                         std::move(documents), std::move(counted),
                                                         pad, want_inputs, want_targets, records));
}

int64_t LongestRow(const torch::Tensor& lengths) {
  return std::max<int64_t>(1, lengths.max().item<int64_t>());
}

torch::Tensor TrimToWidth(const torch::Tensor& microbatch, int64_t width) {
  return microbatch.slice(1, 0, std::min(width, microbatch.size(1))).contiguous();
}

torch::Tensor TrimToLongestRow(const torch::Tensor& microbatch, const torch::Tensor& lengths) {
  return TrimToWidth(microbatch, LongestRow(lengths));
}

void CutToLongestRows(const std::vector<torch::Tensor>& lengths, bool each,
                      std::initializer_list<std::vector<torch::Tensor>*> parts) {
  std::vector<int64_t> widths;
  const int64_t longest = each || lengths.empty() ? 0 : LongestRow(torch::cat(lengths));
  for (size_t mb = 0; mb < lengths.size(); ++mb) {
    widths.push_back(each ? LongestRow(lengths[mb]) : longest);
  }
  for (std::vector<torch::Tensor>* part : parts) {
    for (size_t mb = 0; mb < part->size() && mb < widths.size(); ++mb) {
      (*part)[mb] = TrimToWidth((*part)[mb], widths[mb]);
    }
  }
}

}  // namespace stagecoach::runtime
