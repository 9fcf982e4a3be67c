// Action parse/print against PyTorch's own parser (golden action_grammar.json).
#include <fstream>
#include <map>
#include <string>

#include "common/schedule/action.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/test_paths.h"

namespace stagecoach::schedule::schedule_action_test {
namespace {

using ::testing::HasSubstr;

nlohmann::json LoadGrammar() {
  std::ifstream in(testing::GoldenDir() + "/action_grammar.json");
  EXPECT_TRUE(in.good()) << "missing action_grammar.json";
  return nlohmann::json::parse(in);
}

const std::map<std::string, ActionType>& PyTorchTypeNames() {
  static const auto* names = new std::map<std::string, ActionType>{
      {"FORWARD", ActionType::kForward},
      {"BACKWARD_INPUT", ActionType::kBackwardInput},
      {"BACKWARD_WEIGHT", ActionType::kBackwardWeight},
      {"FULL_BACKWARD", ActionType::kFullBackward},
      {"UNSHARD", ActionType::kUnshard},
      {"RESHARD", ActionType::kReshard},
      {"SEND_F", ActionType::kSendF},
      {"RECV_F", ActionType::kRecvF},
      {"SEND_B", ActionType::kSendB},
      {"RECV_B", ActionType::kRecvB},
      {"REDUCE_GRAD", ActionType::kReduceGrad},
      {"OVERLAP_F_B", ActionType::kOverlapFB},
  };
  return *names;
}

// PyTorch's parser is lax in two documented ways; ours is strict there and must say so.
bool PyTorchIsLaxHere(const std::string& input) {
  return input == "2F0xyz" || input == "(0F1;1B0)B";
}

TEST(ActionGrammar, MatchesPyTorchParserOnEveryGoldenString) {
  int checked = 0;
  for (const auto& entry : LoadGrammar()) {
    if (!entry.contains("input")) continue;
    const std::string input = entry["input"];
    SCOPED_TRACE("input \"" + input + "\"");
    auto parsed = ParseAction(input);
    ++checked;
    if (entry.contains("error") || PyTorchIsLaxHere(input)) {
      ASSERT_FALSE(parsed.ok());
      EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("\"" + input + "\""));
      continue;
    }
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    if (entry["parsed"].is_null()) {
      EXPECT_FALSE(parsed->has_value());
      continue;
    }
    ASSERT_TRUE(parsed->has_value());
    const Action& action = **parsed;
    const auto& want = entry["parsed"];
    EXPECT_EQ(action.stage, want["stage_index"].get<int>());
    EXPECT_EQ(action.type, PyTorchTypeNames().at(want["computation_type"].get<std::string>()));
    if (want["microbatch_index"].is_null()) {
      EXPECT_FALSE(action.microbatch.has_value());
    } else {
      EXPECT_EQ(action.microbatch, want["microbatch_index"].get<int>());
    }
    if (want["sub_actions"].is_null()) {
      EXPECT_TRUE(action.sub_actions.empty());
    } else {
      ASSERT_EQ(action.sub_actions.size(), want["sub_actions"].size());
      for (size_t i = 0; i < action.sub_actions.size(); ++i) {
        EXPECT_EQ(action.sub_actions[i].ToString(), want["sub_actions"][i].get<std::string>());
      }
    }
    EXPECT_EQ(action.ToString(), entry["repr"].get<std::string>());
  }
  EXPECT_GE(checked, 19);
}

TEST(ActionGrammar, TypeNamesAndComputeFlagsMatchPyTorch) {
  for (const auto& entry : LoadGrammar()) {
    if (entry.contains("_ComputationType")) {
      for (const auto& [name, text] : entry["_ComputationType"].items()) {
        EXPECT_EQ(ActionTypeName(PyTorchTypeNames().at(name)), text.get<std::string>()) << name;
      }
    }
    if (entry.contains("is_compute_op")) {
      for (const auto& [name, flag] : entry["is_compute_op"].items()) {
        EXPECT_EQ(IsCompute(PyTorchTypeNames().at(name)), flag.get<bool>()) << name;
      }
    }
  }
}

TEST(ActionGrammar, EveryPrintedActionParsesBack) {
  std::vector<Action> actions;
  for (const auto& [name, type] : PyTorchTypeNames()) {
    if (type == ActionType::kOverlapFB) continue;
    actions.push_back(
        Action::Make(7, type, HasMicrobatch(type) ? std::optional<int>(12) : std::nullopt));
  }
  actions.push_back(Action{
      -1,
      ActionType::kOverlapFB,
      std::nullopt,
      {Action::Make(0, ActionType::kForward, 3), Action::Make(3, ActionType::kFullBackward, 1)}});
  for (const Action& action : actions) {
    auto parsed = ParseRequiredAction(action.ToString());
    ASSERT_TRUE(parsed.ok()) << action << ": " << parsed.status();
    EXPECT_EQ(*parsed, action);
  }
}

TEST(ActionGrammar, StrictErrorsExplainWhatIsWrong) {
  struct Case {
    const char* input;
    const char* why;
  };
  for (const Case& c : std::initializer_list<Case>{
           {"2F", "needs a microbatch index"},
           {"1UNSHARD3", "takes no microbatch index"},
           {"2F0xyz", "not a microbatch index"},
           {"(0F1;1B0)B", "only OVERLAP_F_B"},
           {"((0F1;1B0)OVERLAP_F_B;1F0)OVERLAP_F_B", "nested"},
           {"(0F1)OVERLAP_F_B", "at least two"},
           {"(0F1;1B0", "unbalanced"},
           {"3X1", "unknown action type \"X1\""},
           {"F0", "must start with a stage number"},
           // Indices that do not fit an int (issue 20): refused, not wrapped around.
           {"99999999999999999999F0", "stage number 99999999999999999999 is too large"},
           {"0F99999999999999999999", "microbatch index 99999999999999999999 is too large"},
           {"(0F0;1234567890B0)OVERLAP_F_B", "stage number 1234567890 is too large"},
       }) {
    auto parsed = ParseAction(c.input);
    ASSERT_FALSE(parsed.ok()) << c.input;
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(c.why)) << c.input;
  }
  EXPECT_FALSE(ParseRequiredAction("   ").ok());
}

}  // namespace
}  // namespace stagecoach::schedule::schedule_action_test
