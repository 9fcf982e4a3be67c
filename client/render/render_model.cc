#include "client/render/render_model.h"

#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace stagecoach::client {
namespace {

// 1234567 -> "1,234,567".
std::string Thousands(int64_t n) {
  std::string digits = absl::StrCat(n < 0 ? -n : n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

}  // namespace

std::string ModelTable(const std::string& model, const v1::DescribeModelResponse& described) {
  std::ostringstream out;
  out << model << ": " << described.layers_size() << " layers, "
      << (described.sequential() ? "a plain chain" : "cut from its forward graph");
  if (!described.model_sha256().empty()) out << "; sha256 " << described.model_sha256();
  if (!described.inspected_by().empty()) out << "; inspected by " << described.inspected_by();
  out << "\n";
  size_t width = 11;  // "SPLIT POINT"
  for (const v1::SplitCandidate& c : described.split_candidates()) {
    width = std::max(width, 2 * static_cast<size_t>(c.depth()) + c.name().size());
  }
  out << absl::StrFormat("%-*s  %12s  %s\n", width, "SPLIT POINT", "PARAMETERS", "LAYER");
  for (const v1::SplitCandidate& c : described.split_candidates()) {
    const std::string indented = std::string(2 * c.depth(), ' ') + c.name();
    std::string row = absl::StrFormat("%-*s  %12s", width, indented, Thousands(c.parameters()));
    if (c.layer()) absl::StrAppend(&row, "  layer");
    out << row << "\n";
  }
  out << "split.points takes any of these names: a layer as it is; a module holding layers at its "
         "first (beginning) or last (end); a module inside a layer opens the layer into its "
         "calls.\n";
  return out.str();
}

nlohmann::json ModelJson(const std::string& model, const v1::DescribeModelResponse& described) {
  nlohmann::json layers = nlohmann::json::array();
  for (const v1::LayerInfo& l : described.layers()) {
    layers.push_back({{"name", l.name()}, {"parameters", l.parameters()}});
  }
  nlohmann::json candidates = nlohmann::json::array();
  for (const v1::SplitCandidate& c : described.split_candidates()) {
    candidates.push_back({{"name", c.name()},
                          {"parameters", c.parameters()},
                          {"depth", c.depth()},
                          {"layer", c.layer()}});
  }
  return {{"model", model},
          {"model_sha256", described.model_sha256()},
          {"inspected_by", described.inspected_by()},
          {"sequential", described.sequential()},
          {"layers", layers},
          {"split_candidates", candidates}};
}

}  // namespace stagecoach::client
