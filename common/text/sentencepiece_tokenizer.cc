#include "common/text/sentencepiece_tokenizer.h"

#include <unistd.h>

#include <cstdio>
#include <tuple>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/text/sentencepiece_adapter.h"

namespace stagecoach::text {

SentencePieceTokenizer::SentencePieceTokenizer(SentencePieceTokenizer&&) noexcept = default;
SentencePieceTokenizer& SentencePieceTokenizer::operator=(SentencePieceTokenizer&&) noexcept =
    default;
SentencePieceTokenizer::~SentencePieceTokenizer() = default;

absl::StatusOr<SentencePieceTokenizer> SentencePieceTokenizer::Load(const std::string& path) {
  SentencePieceTokenizer t;
  t.path_ = path;
  t.processor_ = std::make_unique<SentencePieceAdapter>();
  const std::string error = t.processor_->Load(path);
  if (!error.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer ", path, ": not a SentencePiece model (", error, ")"));
  }
  return t;
}

int SentencePieceTokenizer::vocab_size() const { return processor_->PieceSize(); }
int SentencePieceTokenizer::bos_id() const { return processor_->BosId(); }
int SentencePieceTokenizer::eos_id() const { return processor_->EosId(); }

absl::StatusOr<std::vector<int64_t>> SentencePieceTokenizer::Encode(absl::string_view text,
                                                                    absl::string_view origin,
                                                                    bool bos, bool eos) const {
  std::vector<int> ids;
  const std::string error = processor_->Encode(std::string(text), &ids);
  if (!error.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": tokenizer ", path_, " cannot encode it: ", error));
  }
  for (const auto& [wanted, id, what] :
       {std::tuple<bool, int, const char*>{bos, bos_id(), "BOS"}, {eos, eos_id(), "EOS"}}) {
    if (wanted && id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer ", path_, " has no ", what, " piece"));
    }
  }
  std::vector<int64_t> out;
  out.reserve(ids.size() + 2);
  if (bos) out.push_back(bos_id());
  out.insert(out.end(), ids.begin(), ids.end());
  if (eos) out.push_back(eos_id());
  return out;
}

absl::StatusOr<std::string> SentencePieceTokenizer::Decode(const std::vector<int64_t>& ids) const {
  std::vector<int> narrow;
  narrow.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat("token ", i, " is ", ids[i], ", outside ",
                                                     path_, "'s ", vocab_size(), " pieces"));
    }
    narrow.push_back(static_cast<int>(ids[i]));
  }
  std::string text;
  const std::string error = processor_->Decode(narrow, &text);
  if (!error.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer ", path_, " cannot decode: ", error));
  }
  return text;
}

absl::StatusOr<std::string> TrainSentencePiece(const std::vector<std::string>& files,
                                               int vocab_size) {
  if (files.empty()) return absl::InvalidArgumentError("no text files to train on");
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::temp_directory_path(ec) /
                                    absl::StrCat("stagecoach-spm-", ::getpid());
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir.string(), ": ", ec.message()));
  const std::string prefix = (dir / "tokenizer").string();
  const std::string args = absl::StrCat(
      "--input=", absl::StrJoin(files, ","), " --model_prefix=", prefix,
      " --vocab_size=", vocab_size,
      // Llama 2's recipe: BPE, every character kept, unknown ones as bytes, the text as it is
      // (no normalisation, whitespace kept), digits one by one.
      " --model_type=bpe --character_coverage=1.0 --byte_fallback=true"
      " --normalization_rule_name=identity --remove_extra_whitespaces=false --split_digits=true"
      " --unk_id=0 --bos_id=1 --eos_id=2 --pad_id=-1 --num_threads=1 --minloglevel=2");
  const std::string error = TrainSentencePieceModel(args);
  absl::StatusOr<std::string> result;
  if (!error.empty()) {
    result = absl::InvalidArgumentError(absl::StrCat("training a tokenizer of ", vocab_size,
                                                     " pieces on ", absl::StrJoin(files, ", "),
                                                     " failed: ", error));
  } else {
    std::ifstream in(prefix + ".model", std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    if (!in) {
      result = absl::InternalError(absl::StrCat("cannot read the trained model ", prefix, ".model"));
    } else {
      result = bytes.str();
    }
  }
  std::filesystem::remove_all(dir, ec);
  return result;
}

absl::StatusOr<std::string> TokenFileBytes(const std::vector<int64_t>& ids,
                                           absl::string_view dtype) {
  size_t width = 0;
  if (dtype == "uint16") width = 2;
  if (dtype == "uint32") width = 4;
  if (width == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("token dtype '", dtype, "': must be uint16 or uint32"));
  }
  const int64_t limit = int64_t{1} << (8 * width);
  std::string out(ids.size() * width, '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= limit) {
      return absl::InvalidArgumentError(absl::StrCat("token ", i, " is ", ids[i],
                                                     ", which does not fit ", dtype,
                                                     dtype == "uint16" ? " (use uint32)" : ""));
    }
    for (size_t b = 0; b < width; ++b) {
      out[i * width + b] = static_cast<char>((ids[i] >> (8 * b)) & 0xff);
    }
  }
  return out;
}

}  // namespace stagecoach::text
