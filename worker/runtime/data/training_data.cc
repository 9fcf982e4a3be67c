#include "worker/runtime/data/training_data.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/spec/builtin_model.h"
#include "common/util/status_macros.h"
#include "worker/runtime/data/document_rows.h"
#include "worker/runtime/data/jsonl_records.h"

namespace stagecoach::runtime {
namespace {

torch::Tensor Randn(std::vector<int64_t> shape, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return torch::randn(shape, gen, torch::kFloat32);
}

class SyntheticSource : public BatchSource {
 public:
  SyntheticSource(const spec::JobSpec& spec, bool want_inputs, bool want_targets)
      : spec_(spec), want_inputs_(want_inputs), want_targets_(want_targets) {}

  absl::StatusOr<Batch> Make(int64_t step) override {
    const auto& sizes = spec_.model.builtin->sizes;
    const int64_t in = sizes.front();
    const int64_t out = sizes.back();
    const int64_t rows = spec_.training.batch_size;
    const uint64_t seed = spec_.data.seed;
    torch::NoGradGuard no_grad;
    Batch batch;
    if (!want_inputs_ && !want_targets_) return batch;
    torch::Tensor x = Randn({rows, in}, seed + 1 + static_cast<uint64_t>(step));
    if (want_inputs_) batch.inputs = x;
    if (want_targets_) {
      torch::Tensor teacher = Randn({in, out}, seed) / std::sqrt(static_cast<double>(in));
      torch::Tensor logits = torch::matmul(x, teacher);
      if (spec_.training.loss == "cross_entropy") {
        batch.targets = logits.argmax(1);
      } else {
        batch.targets = torch::tanh(logits);
      }
    }
    return batch;
  }

 private:
  spec::JobSpec spec_;
  bool want_inputs_;
  bool want_targets_;
};

// Synthetic token rows for a built-in decoder (gpt, llama): arithmetic sequences modulo the vocabulary, from a
// start and a stride drawn per row from generator(seed + 1 + step). The next token follows from
// the two before it, so a model can learn the task.
class SyntheticTokensSource : public BatchSource {
 public:
  SyntheticTokensSource(const spec::JobSpec& spec, bool want_inputs, bool want_targets)
      : spec_(spec), want_inputs_(want_inputs), want_targets_(want_targets) {}

  absl::StatusOr<Batch> Make(int64_t step) override {
    Batch batch;
    if (!want_inputs_ && !want_targets_) return batch;
    const int64_t rows = spec_.training.batch_size;
    const int64_t seq = spec_.model.builtin->seq;
    const int64_t vocab = spec_.model.builtin->vocab;
    at::Generator gen =
        at::detail::createCPUGenerator(spec_.data.seed + 1 + static_cast<uint64_t>(step));
    torch::Tensor start = torch::randint(0, vocab, {rows, 1}, gen, torch::kInt64);
    torch::Tensor stride =
        torch::randint(1, std::max<int64_t>(vocab, 2), {rows, 1}, gen, torch::kInt64);
    torch::Tensor tokens =
        (start + stride * torch::arange(seq + 1, torch::kInt64).unsqueeze(0)).remainder(vocab);
    if (want_inputs_) batch.inputs = tokens.slice(1, 0, seq).contiguous();
    if (want_targets_) batch.targets = tokens.slice(1, 1, seq + 1).contiguous();
    return batch;
  }

 private:
  spec::JobSpec spec_;
  bool want_inputs_;
  bool want_targets_;
};

// The id that ends a document: data.eos, else the model's eos_token_id.
absl::StatusOr<int64_t> DocumentEnd(const spec::JobSpec& spec) {
  if (spec.data.eos.has_value()) return *spec.data.eos;
  if (spec.model.builtin.has_value() && spec.model.builtin->decoder.has_value() &&
      spec.model.builtin->decoder->eos_token_id.has_value()) {
    return *spec.model.builtin->decoder->eos_token_id;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "data.packing: ", spec.data.packing, " needs the id that ends each document: data.eos (the ",
      "model has no eos_token_id)"));
}

// A flat little-endian uint16 or uint32 (data.dtype) token file, read into memory once.
class TokensSource : public BatchSource {
 public:
  static absl::StatusOr<std::unique_ptr<BatchSource>> Open(const spec::JobSpec& spec,
                                                           bool want_inputs, bool want_targets) {
    const std::string& path = spec.data.path;
    const int64_t seq = WindowLength(spec);
    // A TorchScript model declares no vocabulary: any token of the file's dtype is accepted.
    const int64_t vocab = spec.model.builtin.has_value() ? spec.model.builtin->vocab
                                                         : int64_t{1} << 32;
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.path: cannot open '", path, "': ", std::strerror(errno)));
    }
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) {
      return absl::InvalidArgumentError(absl::StrCat("data.path: cannot read '", path, "'"));
    }
    const size_t width = spec.data.dtype == "uint32" ? 4 : 2;
    if (bytes.size() % width != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.path: '", path, "' has ", bytes.size(), " bytes, not a whole number of ",
                       spec.data.dtype, " tokens (data.dtype; a tokens file is flat "
                       "little-endian)"));
    }
    const int64_t n = static_cast<int64_t>(bytes.size() / width);
    std::optional<int64_t> eos;
    if (!spec.data.packing.empty()) {
      ASSIGN_OR_RETURN(eos, DocumentEnd(spec));
      if (*eos >= vocab) {
        return absl::InvalidArgumentError(
            absl::StrCat("data.eos: ", *eos, " is not below model.builtin.vocab = ", vocab));
      }
    } else if (n < seq + 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.path: '", path, "' holds ", n, " tokens, fewer than ",
          spec.model.builtin.has_value() ? "model.builtin.seq" : "data.seq", " + 1 = ", seq + 1));
    }
    std::vector<int64_t> tokens(n);
    for (int64_t i = 0; i < n; ++i) {
      int64_t token = 0;
      for (size_t b = 0; b < width; ++b) {
        token |= static_cast<int64_t>(static_cast<unsigned char>(bytes[i * width + b])) << (8 * b);
      }
      tokens[i] = token;
      if (tokens[i] >= vocab) {
        return absl::InvalidArgumentError(
            absl::StrCat("data.path: '", path, "' token ", i, " is ", tokens[i],
                         ", not below model.builtin.vocab = ", vocab));
      }
    }
    if (eos.has_value()) {
      return OpenDocumentSource(spec, std::move(tokens), *eos, want_inputs, want_targets);
    }
    return std::unique_ptr<BatchSource>(
        new TokensSource(spec, std::move(tokens), want_inputs, want_targets));
  }

  absl::StatusOr<Batch> Make(int64_t step) override {
    Batch batch;
    if (!want_inputs_ && !want_targets_) return batch;
    const int64_t n = static_cast<int64_t>(tokens_.size());
    const int64_t rows = spec_.training.batch_size;
    const int64_t seq = WindowLength(spec_);
    at::Generator gen =
        at::detail::createCPUGenerator(spec_.data.seed + 1 + static_cast<uint64_t>(step));
    torch::Tensor starts = torch::randint(0, n - seq, {rows}, gen, torch::kInt64);
    torch::Tensor windows = torch::empty({rows, seq + 1}, torch::kInt64);
    const int64_t* start = starts.data_ptr<int64_t>();
    int64_t* out = windows.data_ptr<int64_t>();
    for (int64_t r = 0; r < rows; ++r) {
      std::copy_n(tokens_.data() + start[r], seq + 1, out + r * (seq + 1));
    }
    if (want_inputs_) batch.inputs = windows.slice(1, 0, seq).contiguous();
    if (want_targets_) batch.targets = windows.slice(1, 1, seq + 1).contiguous();
    return batch;
  }

 private:
  TokensSource(const spec::JobSpec& spec, std::vector<int64_t> tokens, bool want_inputs,
               bool want_targets)
      : spec_(spec),
        tokens_(std::move(tokens)),
        want_inputs_(want_inputs),
        want_targets_(want_targets) {}

  spec::JobSpec spec_;
  std::vector<int64_t> tokens_;
  bool want_inputs_;
  bool want_targets_;
};

// A pickled value's kind and a tensor's dtype as a Python user would name them.
std::string PythonKind(const c10::IValue& v) {
  if (v.isList()) return "list";
  if (v.isGenericDict()) return "dict";
  if (v.isTuple()) return "tuple";
  if (v.isInt()) return "int";
  if (v.isDouble()) return "float";
  if (v.isBool()) return "bool";
  if (v.isString()) return "str";
  if (v.isNone()) return "None";
  return v.tagKind();
}

std::string PythonDtype(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat32:
      return "torch.float32";
    case torch::kFloat64:
      return "torch.float64";
    case torch::kFloat16:
      return "torch.float16";
    case torch::kBFloat16:
      return "torch.bfloat16";
    case torch::kInt64:
      return "torch.int64";
    case torch::kInt32:
      return "torch.int32";
    case torch::kInt16:
      return "torch.int16";
    case torch::kInt8:
      return "torch.int8";
    case torch::kUInt8:
      return "torch.uint8";
    case torch::kBool:
      return "torch.bool";
    default:
      return std::string(c10::toString(t));
  }
}

// A file written by torch.save({"inputs": X, "targets": Y}), read into memory once.
class TensorsSource : public BatchSource {
 public:
  static absl::StatusOr<std::unique_ptr<BatchSource>> Open(const spec::JobSpec& spec,
                                                           bool want_inputs, bool want_targets) {
    const std::string& path = spec.data.path;
    auto bad = [&](const std::string& problem) {
      return absl::InvalidArgumentError(absl::StrCat("data.path: '", path, "' ", problem));
    };
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.path: cannot open '", path, "': ", std::strerror(errno)));
    }
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) {
      return absl::InvalidArgumentError(absl::StrCat("data.path: cannot read '", path, "'"));
    }
    c10::IValue value;
    try {
      value = torch::pickle_load(bytes);
    } catch (const std::exception& e) {
      std::string what = e.what();
      what = what.substr(0, what.find('\n'));
      return bad(absl::StrCat(
          "is not a file written by torch.save({\"inputs\": X, \"targets\": Y}): ", what));
    }
    if (!value.isGenericDict()) {
      return bad(absl::StrCat("holds a ", PythonKind(value),
                              ", not a dict {\"inputs\": X, \"targets\": Y}"));
    }
    torch::Tensor x, y;
    for (const auto& entry : value.toGenericDict()) {
      if (!entry.key().isString()) continue;
      const std::string key = entry.key().toStringRef();
      if (key != "inputs" && key != "targets") continue;
      if (!entry.value().isTensor()) {
        return bad(
            absl::StrCat("\"", key, "\" holds a ", PythonKind(entry.value()), ", not a tensor"));
      }
      (key == "inputs" ? x : y) = entry.value().toTensor();
    }
    if (!x.defined()) return bad("has no \"inputs\" key");
    if (!y.defined()) return bad("has no \"targets\" key");
    auto shape = [](const torch::Tensor& t) {
      return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]");
    };
    auto dtype = [](const torch::Tensor& t) { return PythonDtype(t.scalar_type()); };

    if (x.is_complex() || x.scalar_type() == torch::kBool) {
      return bad(absl::StrCat("\"inputs\" has dtype ", dtype(x), "; it must be real numbers"));
    }
    if (x.dim() < 1 || x.size(0) < 1) return bad("holds no rows (\"inputs\" has N = 0)");
    const int64_t n = x.size(0);
    if (y.dim() < 1 || y.size(0) != n) {
      return bad(absl::StrCat("\"inputs\" has ", n, " rows but \"targets\" has shape ", shape(y),
                              "; both need the same number of rows (dim 0)"));
    }
    if (!spec.model.builtin.has_value()) {
      // A TorchScript model: rows of any shape; floating-point inputs become float32 (the
      // model's dtype), integer ones int64 (ids for an embedding).
      if (spec.training.loss == "cross_entropy") {
        if (!c10::isIntegralType(y.scalar_type(), /*includeBool=*/false)) {
          return bad(absl::StrCat("\"targets\" is ", dtype(y), " ", shape(y),
                                  "; training.loss cross_entropy needs integer class indices"));
        }
        y = y.to(torch::kInt64);
      } else {
        if (!y.is_floating_point()) {
          return bad(absl::StrCat("\"targets\" is ", dtype(y), " ", shape(y), "; training.loss ",
                                  spec.training.loss, " needs floating-point targets"));
        }
        y = y.to(torch::kFloat32);
      }
      x = x.is_floating_point() ? x.to(torch::kFloat32) : x.to(torch::kInt64);
      return std::unique_ptr<BatchSource>(
          new TensorsSource(spec, want_inputs ? x.contiguous() : torch::Tensor(),
                            want_targets ? y.contiguous() : torch::Tensor()));
    }
    const auto& sizes = spec.model.builtin->sizes;
    const int64_t in_width = sizes.front();
    const int64_t out = sizes.back();
    if (x.dim() != 2 || x.size(1) != in_width) {
      return bad(absl::StrCat("\"inputs\" has shape ", shape(x), "; it must be [N, ", in_width,
                              "] (N rows of model.builtin.sizes[0] = ", in_width, " features)"));
    }
    if (spec.training.loss == "cross_entropy") {
      if (!c10::isIntegralType(y.scalar_type(), /*includeBool=*/false) || y.dim() != 1) {
        return bad(absl::StrCat("\"targets\" is ", dtype(y), " ", shape(y),
                                "; training.loss cross_entropy needs int64 class indices [", n,
                                "]"));
      }
      y = y.to(torch::kInt64);
      const int64_t lo = y.min().item<int64_t>();
      const int64_t hi = y.max().item<int64_t>();
      if (lo < 0 || hi >= out) {
        return bad(absl::StrCat("\"targets\" holds class ", lo < 0 ? lo : hi, ", outside [0, ", out,
                                ") (model.builtin.sizes[-1] = ", out, " classes)"));
      }
    } else {
      if (!y.is_floating_point() || y.dim() != 2 || y.size(1) != out) {
        return bad(absl::StrCat("\"targets\" is ", dtype(y), " ", shape(y), "; training.loss ",
                                spec.training.loss, " needs floating-point [", n, ", ", out,
                                "] (model.builtin.sizes[-1] = ", out, ")"));
      }
      y = y.to(torch::kFloat32);
    }
    x = x.to(torch::kFloat32);
    return std::unique_ptr<BatchSource>(
        new TensorsSource(spec, want_inputs ? x.contiguous() : torch::Tensor(),
                          want_targets ? y.contiguous() : torch::Tensor()));
  }

  absl::StatusOr<Batch> Make(int64_t step) override {
    Batch batch;
    const torch::Tensor& any = inputs_.defined() ? inputs_ : targets_;
    if (!any.defined()) return batch;
    const int64_t n = any.size(0);
    const int64_t rows = spec_.training.batch_size;
    // Rows (step * rows + i) mod N, computed without overflow.
    const int64_t start = ((step % n) * (rows % n)) % n;
    torch::Tensor index = (torch::arange(rows, torch::kInt64) + start).remainder(n);
    if (inputs_.defined()) batch.inputs = inputs_.index_select(0, index);
    if (targets_.defined()) batch.targets = targets_.index_select(0, index);
    return batch;
  }

 private:
  TensorsSource(const spec::JobSpec& spec, torch::Tensor inputs, torch::Tensor targets)
      : spec_(spec), inputs_(std::move(inputs)), targets_(std::move(targets)) {}

  spec::JobSpec spec_;
  torch::Tensor inputs_;   // float32 (or int64 ids) [N, ...], undefined unless wanted
  torch::Tensor targets_;  // int64 or float32 [N, ...], undefined unless wanted
};

class EmptySource : public BatchSource {
 public:
  absl::StatusOr<Batch> Make(int64_t) override { return Batch{}; }
};

}  // namespace

int64_t WindowLength(const spec::JobSpec& spec) {
  return spec.model.builtin.has_value() ? spec.model.builtin->seq : spec.data.seq;
}

absl::StatusOr<std::unique_ptr<BatchSource>> BatchSource::Open(const spec::JobSpec& spec,
                                                               bool want_inputs,
                                                               bool want_targets) {
  const std::string family =
      spec.model.builtin.has_value() ? spec.model.builtin->family : std::string("torchscript");
  const bool decoder = spec.model.builtin.has_value() && spec::IsDecoder(*spec.model.builtin);
  if (spec.data.kind == "synthetic") {
    if (decoder) {
      return std::unique_ptr<BatchSource>(
          new SyntheticTokensSource(spec, want_inputs, want_targets));
    }
    if (family != "mlp") {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.kind: synthetic data needs a built-in mlp, gpt or llama model (model is ", family,
          ")"));
    }
    return std::unique_ptr<BatchSource>(new SyntheticSource(spec, want_inputs, want_targets));
  }
  if (spec.data.kind == "tokens") {
    if (!decoder && family != "torchscript") {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.kind: tokens data needs a built-in gpt or llama or a TorchScript model (model is ",
          family, ")"));
    }
    if (family == "torchscript" && spec.data.packing == "pack") {
      return absl::InvalidArgumentError(
          "data.packing: pack needs a built-in gpt or llama model (their attention keeps to each "
          "document of a row); a TorchScript model takes pad");
    }
    if (family == "torchscript" && spec.data.seq <= 0) {
      return absl::InvalidArgumentError(
          "data.seq: required for data.kind tokens with a TorchScript model");
    }
    if (spec.data.path.empty()) {
      return absl::InvalidArgumentError("data.path: required for data.kind tokens");
    }
    // Packed rows' segments are for every rank: each stage keeps the documents apart.
    if (!want_inputs && !want_targets && spec.data.packing != "pack") {
      return std::unique_ptr<BatchSource>(new EmptySource());
    }
    return TokensSource::Open(spec, want_inputs, want_targets);
  }
  if (spec.data.kind == "jsonl") {
    if (!decoder && family != "torchscript") {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.kind: jsonl records need a built-in gpt or llama or a TorchScript model (model is ",
          family, ")"));
    }
    if (family == "torchscript" && spec.data.seq <= 0) {
      return absl::InvalidArgumentError(
          "data.seq: required for data.kind jsonl with a TorchScript model");
    }
    if (family == "torchscript" && spec.data.packing == "pack") {
      return absl::InvalidArgumentError(
          "data.packing: pack needs a built-in gpt or llama model (their attention keeps to each "
          "record of a row); a TorchScript model takes pad");
    }
    if (!want_inputs && !want_targets && spec.data.packing != "pack") {
      return std::unique_ptr<BatchSource>(new EmptySource());
    }
    ASSIGN_OR_RETURN(
        JsonlRecords records,
        ReadJsonlRecords(spec, WindowLength(spec), decoder ? spec.model.builtin->vocab : 0));
    return OpenJsonlSource(spec, std::move(records), want_inputs, want_targets);
  }
  if (spec.data.kind == "tensors") {
    if (family != "mlp" && family != "torchscript") {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.kind: tensors data needs a built-in mlp or a TorchScript model (model is ", family,
          ")"));
    }
    if (spec.data.path.empty()) {
      return absl::InvalidArgumentError("data.path: required for data.kind tensors");
    }
    if (!want_inputs && !want_targets) return std::unique_ptr<BatchSource>(new EmptySource());
    return TensorsSource::Open(spec, want_inputs, want_targets);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("data.kind: '", spec.data.kind, "' is not supported by this worker yet"));
}

absl::StatusOr<Batch> MakeBatch(const spec::JobSpec& spec, int64_t step, bool want_inputs,
                                bool want_targets) {
  auto source = BatchSource::Open(spec, want_inputs, want_targets);
  if (!source.ok()) return source.status();
  return (*source)->Make(step);
}

std::vector<torch::Tensor> SplitMicrobatches(const torch::Tensor& batch, int n) {
  return torch::tensor_split(batch, n, 0);
}

std::vector<torch::Tensor> ReplicaMicrobatches(const torch::Tensor& batch, int m,
                                               const ReplicaShare& share) {
  if (share.replicas <= 1) return SplitMicrobatches(batch, m);
  std::vector<torch::Tensor> all = SplitMicrobatches(batch, share.replicas * m);
  return std::vector<torch::Tensor>(all.begin() + share.replica * m,
                                    all.begin() + (share.replica + 1) * m);
}

}  // namespace stagecoach::runtime
