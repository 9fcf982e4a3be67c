#include "common/spec/yaml_documents.h"

#include <yaml-cpp/eventhandler.h>

#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"

namespace stagecoach::spec {
namespace {

// Records where each document starts; ignores the rest.
class DocumentStarts : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override { starts.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}

  std::vector<YAML::Mark> starts;
};

absl::Status InvalidAt(absl::string_view origin, const YAML::Mark& mark, absl::string_view why) {
  if (mark.is_null()) return absl::InvalidArgumentError(absl::StrCat(origin, ": invalid YAML: ", why));
  return absl::InvalidArgumentError(absl::StrCat(origin, ":", mark.line + 1, ":", mark.column + 1,
                                                 ": invalid YAML: ", why));
}

}  // namespace

absl::StatusOr<std::vector<YAML::Node>> LoadYamlDocuments(absl::string_view text,
                                                          absl::string_view origin,
                                                          int max_documents) {
  const std::string owned(text);
  try {
    std::istringstream in(owned);
    YAML::Parser parser(in);
    DocumentStarts documents;
    while (static_cast<int>(documents.starts.size()) <= max_documents &&
           parser.HandleNextDocument(documents)) {
      const size_t n = documents.starts.size();
      if (n >= 2 && documents.starts[n - 1].pos <= documents.starts[n - 2].pos) {
        return InvalidAt(origin, documents.starts[n - 1],
                         "the parser cannot read past this point");
      }
    }
    if (static_cast<int>(documents.starts.size()) > max_documents) {
      return absl::InvalidArgumentError(
          absl::StrCat(origin, ": expected ", max_documents == 1 ? "one YAML document"
                                                                 : absl::StrCat("at most ",
                                                                                max_documents,
                                                                                " YAML documents"),
                       ", got ", documents.starts.size()));
    }
    // Every document read on: loading them terminates.
    return YAML::LoadAll(owned);
  } catch (const YAML::Exception& e) {
    return InvalidAt(origin, e.mark, e.msg);
  }
}

}  // namespace stagecoach::spec
