// No Abseil header may be included here (sentencepiece_adapter.h says why).
#include "common/text/sentencepiece_adapter.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

namespace stagecoach::text {
namespace {

std::string Message(const sentencepiece::util::Status& status) {
  return status.ok() ? std::string() : status.ToString();
}

}  // namespace

SentencePieceAdapter::SentencePieceAdapter()
    : processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {}
SentencePieceAdapter::~SentencePieceAdapter() = default;

std::string SentencePieceAdapter::Load(const std::string& path) {
  return Message(processor_->Load(path));
}
int SentencePieceAdapter::PieceSize() const { return processor_->GetPieceSize(); }
int SentencePieceAdapter::BosId() const { return processor_->bos_id(); }
int SentencePieceAdapter::EosId() const { return processor_->eos_id(); }

std::string SentencePieceAdapter::Encode(const std::string& text, std::vector<int>* ids) const {
  return Message(processor_->Encode(text, ids));
}

std::string SentencePieceAdapter::Decode(const std::vector<int>& ids, std::string* text) const {
  return Message(processor_->Decode(ids, text));
}

std::string TrainSentencePieceModel(const std::string& args) {
  return Message(sentencepiece::SentencePieceTrainer::Train(args));
}

}  // namespace stagecoach::text
