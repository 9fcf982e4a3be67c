#include "client/tokens/sentencepiece_tokens.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <ostream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/tokens/file_io.h"
#include "client/tokens/sentencepiece_records.h"
#include "common/text/sentencepiece_tokenizer.h"
#include "common/util/status_macros.h"

namespace stagecoach::client {
namespace {

constexpr int kSentencePieceUsage = 2;
constexpr int kSentencePieceBadTokenizer = 3;

// A token file's ids in `dtype`.
absl::StatusOr<std::vector<int64_t>> ReadTokenFile(const std::string& path,
                                                   const std::string& dtype) {
  ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(path, "token file"));
  const size_t width = dtype == "uint32" ? 4 : 2;
  if (bytes.size() % width != 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, " has ", bytes.size(),
                                                   " bytes, not a whole number of ", dtype, "s"));
  }
  std::vector<int64_t> ids(bytes.size() / width);
  for (size_t i = 0; i < ids.size(); ++i) {
    int64_t v = 0;
    for (size_t b = 0; b < width; ++b) {
      v |= static_cast<int64_t>(static_cast<unsigned char>(bytes[i * width + b])) << (8 * b);
    }
    ids[i] = v;
  }
  return ids;
}

absl::Status Train(const TokensCommandOptions& o, std::ostream& out) {
  ASSIGN_OR_RETURN(std::string model, text::TrainSentencePiece(o.inputs, o.vocab_size));
  RETURN_IF_ERROR(WriteWholeFile(o.out_path, model, "tokenizer"));
  out << "trained a tokenizer of " << o.vocab_size << " pieces on " << o.inputs.size()
      << " file" << (o.inputs.size() == 1 ? "" : "s") << ": wrote " << o.out_path << "\n";
  return absl::OkStatus();
}

absl::Status Build(const TokensCommandOptions& o, const text::SentencePieceTokenizer& t,
                   std::ostream& out) {
  if (t.eos_id() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        o.tokenizer_path, " has no EOS piece to put between documents"));
  }
  std::vector<int64_t> ids;
  for (const std::string& path : o.inputs) {
    ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path, "text file"));
    ASSIGN_OR_RETURN(std::vector<int64_t> doc, t.Encode(text, path, /*bos=*/false, /*eos=*/true));
    ids.insert(ids.end(), doc.begin(), doc.end());
  }
  ASSIGN_OR_RETURN(std::string bytes, text::TokenFileBytes(ids, o.dtype));
  RETURN_IF_ERROR(WriteWholeFile(o.out_path, bytes, "token file"));
  out << ids.size() << " tokens of " << o.inputs.size() << " document"
      << (o.inputs.size() == 1 ? "" : "s") << " (EOS " << t.eos_id() << " after each): wrote "
      << o.out_path << " (" << bytes.size() << " bytes, " << o.dtype << ")\n"
      << "Train a built-in llama on it with vocab_size: " << t.vocab_size()
      << " and data: {kind: tokens, path: " << o.out_path << ", dtype: " << o.dtype << "}\n";
  return absl::OkStatus();
}

absl::Status Encode(const TokensCommandOptions& o, const text::SentencePieceTokenizer& t,
                    std::ostream& out) {
  std::vector<int64_t> ids;
  auto add = [&](absl::string_view text, absl::string_view origin) -> absl::Status {
    ASSIGN_OR_RETURN(std::vector<int64_t> doc, t.Encode(text, origin, o.bos, o.eos));
    ids.insert(ids.end(), doc.begin(), doc.end());
    return absl::OkStatus();
  };
  if (o.text.has_value()) {
    RETURN_IF_ERROR(add(*o.text, "--text"));
  } else {
    for (const std::string& path : o.inputs) {
      ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path, "text file"));
      RETURN_IF_ERROR(add(text, path));
    }
  }
  if (o.out_path.empty()) {
    out << absl::StrJoin(ids, " ") << "\n";
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(std::string bytes, text::TokenFileBytes(ids, o.dtype));
  RETURN_IF_ERROR(WriteWholeFile(o.out_path, bytes, "token file"));
  out << ids.size() << " tokens: wrote " << o.out_path << "\n";
  return absl::OkStatus();
}

absl::Status Decode(const TokensCommandOptions& o, const text::SentencePieceTokenizer& t,
                    std::ostream& out) {
  ASSIGN_OR_RETURN(std::vector<int64_t> ids, ReadTokenFile(o.inputs[0], o.dtype));
  // Each document (ending at an EOS) is decoded on its own, so that the next one's first piece
  // starts a text again (its word-start marker is not read as a space).
  absl::StatusOr<std::string> text = std::string();
  std::vector<int64_t> document;
  for (size_t i = 0; i <= ids.size() && text.ok(); ++i) {
    const bool end = i == ids.size() || ids[i] == t.eos_id();
    if (!end) {
      document.push_back(ids[i]);
      continue;
    }
    absl::StatusOr<std::string> part = t.Decode(document);
    if (!part.ok()) {
      text = absl::InvalidArgumentError(absl::StrCat(o.inputs[0], " (the document ending at ",
                                                     i, "): ", part.status().message()));
    } else {
      text->append(*part);
    }
    document.clear();
  }
  RETURN_IF_ERROR(text.status());
  if (o.out_path.empty()) {
    out << *text;
    return absl::OkStatus();
  }
  return WriteWholeFile(o.out_path, *text, "text file");
}

std::string SentencePieceUsageError(const TokensCommandOptions& o) {
  if (o.action != "train" && o.action != "build" && o.action != "encode" && o.action != "decode" &&
      o.action != "records") {
    return absl::StrCat("'", o.action,
                        "' is not an action: train, build, encode, decode or records");
  }
  if ((o.prompt_field != "prompt" || o.response_field != "response") && o.action != "records") {
    return "--prompt-field and --response-field go with records";
  }
  if (o.dtype != "uint16" && o.dtype != "uint32") {
    return absl::StrCat("--dtype ", o.dtype, ": must be uint16 or uint32");
  }
  if ((o.bos || o.eos) && o.action != "encode") return "--bos and --eos go with encode";
  if (o.text.has_value() && o.action != "encode") return "--text goes with encode";
  if (o.action == "train") {
    if (!o.tokenizer_path.empty()) return "train writes --out; --tokenizer is for the others";
    if (o.inputs.empty()) return "train needs one or more text files";
    if (o.vocab_size <= 0) return "train needs --vocab-size N (N > 0)";
    if (o.out_path.empty()) return "train needs --out FILE for the model";
    return "";
  }
  if (o.vocab_size > 0) return "--vocab-size goes with train";
  if (o.action == "build") {
    if (o.inputs.empty()) return "build needs one or more text files";
    if (o.out_path.empty()) return "build needs --out FILE for the tokens";
  } else if (o.action == "encode") {
    if (o.inputs.empty() == !o.text.has_value()) return "encode needs text files or --text, one";
  } else if (o.action == "records") {
    if (o.inputs.size() != 1) return "records needs one JSON Lines file";
    if (o.tokenizer_path.empty()) return "records needs --tokenizer M";
  } else if (o.inputs.size() != 1) {
    return "decode needs one token file";
  }
  return "";
}

}  // namespace

int RunSentencePieceTokens(const TokensCommandOptions& o, std::ostream& out, std::ostream& err) {
  if (const std::string usage = SentencePieceUsageError(o); !usage.empty()) {
    err << "stagectl tokens: " << usage << "\n";
    return kSentencePieceUsage;
  }
  absl::Status done;
  if (o.action == "train") {
    done = Train(o, out);
  } else {
    absl::StatusOr<text::SentencePieceTokenizer> t =
        text::SentencePieceTokenizer::Load(o.tokenizer_path);
    if (!t.ok()) {
      err << "stagectl tokens " << o.action << ": " << t.status().message() << "\n";
      return kSentencePieceBadTokenizer;
    }
    done = o.action == "build"    ? Build(o, *t, out)
           : o.action == "encode" ? Encode(o, *t, out)
           : o.action == "decode" ? Decode(o, *t, out)
                                  : WriteRecordIds(o, *t, out);
  }
  if (!done.ok()) {
    err << "stagectl tokens " << o.action << ": " << done.message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace stagecoach::client
