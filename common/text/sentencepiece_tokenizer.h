// A SentencePiece tokenizer (the library Llama 2 and Mistral ship their tokenizer.model for,
// Debian's libsentencepiece): loading a model file, text to ids and back, and training a model
// from text files. Its own library (stagecoach_sentencepiece), linked by stagectl only.
//
// Token files of documents (BuildTokenFile): each document's ids, the tokenizer's EOS after
// every document (so that a model learns where documents end and data.packing can find them),
// as flat little-endian uint16 or uint32 (data.dtype) — uint16 only for vocabularies of at most
// 65,536 pieces.
//
// Errors name the file (and, for ids, the position of the offending id). Thread-compatible: one
// tokenizer per thread, or const use only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stagecoach::text {

class SentencePieceAdapter;

class SentencePieceTokenizer {
 public:
  // The model file at `path`: INVALID_ARGUMENT naming it when it cannot be read or parsed.
  static absl::StatusOr<SentencePieceTokenizer> Load(const std::string& path);
  SentencePieceTokenizer(SentencePieceTokenizer&&) noexcept;
  SentencePieceTokenizer& operator=(SentencePieceTokenizer&&) noexcept;
  ~SentencePieceTokenizer();

  int vocab_size() const;
  int bos_id() const;  // -1 when the model has none
  int eos_id() const;  // -1 when the model has none

  // `text`'s ids, with BOS before and EOS after when asked (INVALID_ARGUMENT when the model has
  // no such piece). `origin` names the text in errors.
  absl::StatusOr<std::vector<int64_t>> Encode(absl::string_view text, absl::string_view origin,
                                              bool bos = false, bool eos = false) const;
  // The text of `ids`; INVALID_ARGUMENT naming the position of an id outside the vocabulary.
  absl::StatusOr<std::string> Decode(const std::vector<int64_t>& ids) const;

 private:
  SentencePieceTokenizer() = default;
  std::string path_;
  std::unique_ptr<SentencePieceAdapter> processor_;
};

// Trains a BPE model of `vocab_size` pieces on `files` as Llama 2's tokenizer was made (unk 0,
// bos 1, eos 2; every character kept, others as byte pieces; no normalisation, so that decoding
// gives the text back; digits split): the model file's bytes. INVALID_ARGUMENT with the
// library's reason (a vocabulary too large for the text, say).
absl::StatusOr<std::string> TrainSentencePiece(const std::vector<std::string>& files,
                                               int vocab_size);

// The bytes of a token file of `ids` in `dtype` ("uint16" or "uint32"): INVALID_ARGUMENT naming
// the position of an id that does not fit, and for another dtype.
absl::StatusOr<std::string> TokenFileBytes(const std::vector<int64_t>& ids,
                                           absl::string_view dtype);

}  // namespace stagecoach::text
