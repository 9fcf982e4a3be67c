#include "common/schedule/action.h"

#include <cctype>
#include <string>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace stagecoach::schedule {
namespace {

struct TypeName {
  ActionType type;
  absl::string_view name;
};

// Longest names first so that prefix matching never picks "F" out of e.g. "RECV_F".
constexpr TypeName kTypeNames[] = {
    {ActionType::kReduceGrad, "REDUCE_GRAD"},
    {ActionType::kOverlapFB, "OVERLAP_F_B"},
    {ActionType::kUnshard, "UNSHARD"},
    {ActionType::kReshard, "RESHARD"},
    {ActionType::kSendF, "SEND_F"},
    {ActionType::kRecvF, "RECV_F"},
    {ActionType::kSendB, "SEND_B"},
    {ActionType::kRecvB, "RECV_B"},
    {ActionType::kForward, "F"},
    {ActionType::kBackwardInput, "I"},
    {ActionType::kBackwardWeight, "W"},
    {ActionType::kFullBackward, "B"},
};

absl::Status Invalid(absl::string_view text, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("invalid action \"", text, "\": ", why,
                   " (expected [stage][type][microbatch], e.g. 2F0, 1UNSHARD or "
                   "(0F3;3B1)OVERLAP_F_B)"));
}

// Indices have at most this many digits, so that every one fits an int (999,999,999 at most);
// callers such as the CSV loader hold them to much lower limits.
constexpr size_t kMaxIndexDigits = 9;

bool AllDigits(absl::string_view text) {
  for (char c : text) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  return !text.empty();
}

// Parses a non-negative decimal integer made of all of `digits` (at most kMaxIndexDigits).
bool ParseIndex(absl::string_view digits, int* out) {
  if (digits.size() > kMaxIndexDigits || !AllDigits(digits)) return false;
  return absl::SimpleAtoi(digits, out);
}

std::string TooLarge(absl::string_view what, absl::string_view digits) {
  return absl::StrCat(what, " ", digits, " is too large (at most ", kMaxIndexDigits, " digits)");
}

// Parses "{stage}{type}{microbatch?}" (no container).
absl::StatusOr<Action> ParseSimple(absl::string_view text, absl::string_view whole) {
  size_t pos = 0;
  while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) ++pos;
  int stage = 0;
  if (pos > kMaxIndexDigits) return Invalid(whole, TooLarge("stage number", text.substr(0, pos)));
  if (pos == 0 || !ParseIndex(text.substr(0, pos), &stage)) {
    return Invalid(whole, "it must start with a stage number");
  }
  absl::string_view rest = text.substr(pos);
  for (const TypeName& tn : kTypeNames) {
    if (rest.substr(0, tn.name.size()) != tn.name) continue;
    if (tn.type == ActionType::kOverlapFB) {
      return Invalid(whole, "OVERLAP_F_B is a container: write (a;b)OVERLAP_F_B");
    }
    absl::string_view mb_text = rest.substr(tn.name.size());
    Action action = Action::Make(stage, tn.type);
    if (HasMicrobatch(tn.type)) {
      int mb = 0;
      if (mb_text.empty()) {
        return Invalid(whole, absl::StrCat("action type ", tn.name, " needs a microbatch index"));
      }
      if (mb_text.size() > kMaxIndexDigits && AllDigits(mb_text)) {
        return Invalid(whole, TooLarge("microbatch index", mb_text));
      }
      if (!ParseIndex(mb_text, &mb)) {
        return Invalid(
            whole, absl::StrCat("\"", mb_text, "\" after ", tn.name, " is not a microbatch index"));
      }
      action.microbatch = mb;
    } else if (!mb_text.empty()) {
      return Invalid(whole, absl::StrCat("unexpected \"", mb_text, "\" after ", tn.name,
                                         ", which takes no microbatch index"));
    }
    return action;
  }
  return Invalid(whole, absl::StrCat("unknown action type \"", rest, "\""));
}

}  // namespace

absl::string_view ActionTypeName(ActionType type) {
  for (const TypeName& tn : kTypeNames) {
    if (tn.type == type) return tn.name;
  }
  return "?";
}

bool IsCompute(ActionType type) {
  switch (type) {
    case ActionType::kForward:
    case ActionType::kBackwardInput:
    case ActionType::kBackwardWeight:
    case ActionType::kFullBackward:
    case ActionType::kOverlapFB:
      return true;
    default:
      return false;
  }
}

bool HasMicrobatch(ActionType type) {
  switch (type) {
    case ActionType::kUnshard:
    case ActionType::kReshard:
    case ActionType::kReduceGrad:
    case ActionType::kOverlapFB:
      return false;
    default:
      return true;
  }
}

LeafRange LeafActions(const Action& action) {
  if (action.sub_actions.empty()) return LeafRange(&action, 1);
  return LeafRange(action.sub_actions.data(), action.sub_actions.size());
}

bool IsBackwardInputOrFull(ActionType type) {
  return type == ActionType::kBackwardInput || type == ActionType::kFullBackward;
}

bool IsLeafCompute(ActionType type) {
  return type == ActionType::kForward || type == ActionType::kBackwardInput ||
         type == ActionType::kBackwardWeight || type == ActionType::kFullBackward;
}

bool IsSendOrRecv(ActionType type) {
  return type == ActionType::kSendF || type == ActionType::kRecvF || type == ActionType::kSendB ||
         type == ActionType::kRecvB;
}

std::string DescribeLeaf(const Action& leaf, const Action& entry) {
  if (&leaf == &entry) return leaf.ToString();
  return absl::StrCat(leaf.ToString(), " (in ", entry.ToString(), ")");
}

std::string Action::ToString() const {
  if (!sub_actions.empty()) {
    std::string out = "(";
    for (size_t i = 0; i < sub_actions.size(); ++i) {
      if (i > 0) out += ";";
      out += sub_actions[i].ToString();
    }
    return absl::StrCat(out, ")", ActionTypeName(type));
  }
  std::string out = absl::StrCat(stage, ActionTypeName(type));
  if (microbatch.has_value()) absl::StrAppend(&out, *microbatch);
  return out;
}

bool operator<(const Action& a, const Action& b) {
  return std::tie(a.stage, a.type, a.microbatch, a.sub_actions) <
         std::tie(b.stage, b.type, b.microbatch, b.sub_actions);
}

std::ostream& operator<<(std::ostream& os, const Action& action) { return os << action.ToString(); }

absl::StatusOr<std::optional<Action>> ParseAction(absl::string_view raw) {
  absl::string_view text = absl::StripAsciiWhitespace(raw);
  if (text.empty()) return std::optional<Action>();
  if (text.front() != '(') {
    auto action = ParseSimple(text, text);
    if (!action.ok()) return action.status();
    return std::optional<Action>(*std::move(action));
  }
  if (text.find('(', 1) != absl::string_view::npos) {
    return Invalid(text, "containers cannot be nested");
  }
  size_t close = text.find(')');
  if (close == absl::string_view::npos) return Invalid(text, "unbalanced parenthesis");
  absl::string_view inner = text.substr(1, close - 1);
  absl::string_view container = text.substr(close + 1);
  if (container != ActionTypeName(ActionType::kOverlapFB)) {
    return Invalid(
        text, absl::StrCat("\"", container, "\" is not a container type; only OVERLAP_F_B is"));
  }
  Action overlap{-1, ActionType::kOverlapFB, std::nullopt, {}};
  size_t start = 0;
  while (true) {
    size_t semi = inner.find(';', start);
    absl::string_view part = absl::StripAsciiWhitespace(inner.substr(
        start, semi == absl::string_view::npos ? absl::string_view::npos : semi - start));
    auto sub = ParseSimple(part, text);
    if (!sub.ok()) return sub.status();
    overlap.sub_actions.push_back(*std::move(sub));
    if (semi == absl::string_view::npos) break;
    start = semi + 1;
  }
  if (overlap.sub_actions.size() < 2) {
    return Invalid(text, "OVERLAP_F_B needs at least two sub-actions separated by ';'");
  }
  return std::optional<Action>(std::move(overlap));
}

absl::StatusOr<Action> ParseRequiredAction(absl::string_view text) {
  auto parsed = ParseAction(text);
  if (!parsed.ok()) return parsed.status();
  if (!parsed->has_value()) return Invalid(text, "empty action");
  return **std::move(parsed);
}

}  // namespace stagecoach::schedule
