// Debian's SentencePiece headers declare `absl::string_view` as std::string_view, which clashes
// with Debian's Abseil (its own string_view class): no translation unit may include both. This
// adapter is the only file that includes SentencePiece; its interface uses the standard library
// alone, and its .cc is kept out of unity builds (common/CMakeLists.txt). Errors are returned as
// the library's message ("" for success). Thread-compatible.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}  // namespace sentencepiece

namespace stagecoach::text {

class SentencePieceAdapter {
 public:
  SentencePieceAdapter();
  ~SentencePieceAdapter();
  SentencePieceAdapter(const SentencePieceAdapter&) = delete;
  SentencePieceAdapter& operator=(const SentencePieceAdapter&) = delete;

  std::string Load(const std::string& path);
  int PieceSize() const;
  int BosId() const;
  int EosId() const;
  std::string Encode(const std::string& text, std::vector<int>* ids) const;
  std::string Decode(const std::vector<int>& ids, std::string* text) const;

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
};

// SentencePieceTrainer::Train with command-line style `args`.
std::string TrainSentencePieceModel(const std::string& args);

}  // namespace stagecoach::text
