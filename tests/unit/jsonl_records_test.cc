// Fine-tuning records (data.kind jsonl, worker/runtime/data/jsonl_records.h) with a
// SentencePiece model trained by the test (with stagecoach-sentencepiece, the tool the worker
// runs; tests/unit/sentencepiece_tokens_test.cc holds the tool to python3-sentencepiece): each
// record is BOS, the prompt's ids, the response's ids and EOS, and only the response's targets
// (and the EOS) count in the loss; rows of records hide the prompt's targets; overlong records
// are truncated, skipped or fail the job naming their line (data.overlong); bad lines, missing
// fields, a bad tokenizer and a missing tool are refused naming them.
#include "worker/runtime/data/jsonl_records.h"

#include <torch/torch.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/process.h"
#include "tests/support/temp_dir.h"
#include "tests/support/test_paths.h"
#include "worker/runtime/executor/training_setup.h"

namespace stagecoach::runtime::jsonl_records_test {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kSeq = 24;

std::string ToolPath() {
  return stagecoach::testing::BinaryDir() + "/client/stagecoach-sentencepiece";
}

class JsonlRecordsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty());
    setenv("STAGECOACH_SENTENCEPIECE_TOOL", ToolPath().c_str(), 1);
    std::string text;
    for (int i = 0; i < 300; ++i) {
      absl::StrAppend(&text, "what is the stage of worker ", i % 7, "? the stage is ", i % 5,
                      " and the loss fell.\n");
    }
    const std::string corpus = Write("corpus.txt", text);
    model_ = dir_.path() + "/tokenizer.model";
    const stagecoach::testing::CommandResult trained = stagecoach::testing::RunCommand(
        {ToolPath(), "train", corpus, "--vocab-size", "320", "--out", model_}, absl::Seconds(120));
    ASSERT_EQ(trained.exit_code, 0) << trained.err;
  }

  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = dir_.path() + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }

  spec::JobSpec Spec(const std::string& lines, const std::string& overlong = "truncate",
                     const std::string& path = "") {
    spec::JobSpec spec;
    spec.model.builtin = spec::BuiltinModel{};
    spec.model.builtin->family = "gpt";
    spec.model.builtin->vocab = 320;
    spec.model.builtin->seq = kSeq;
    spec.training.batch_size = 4;
    spec.data.kind = "jsonl";
    spec.data.packing = "pad";
    spec.data.path = path.empty() ? Write("train.jsonl", lines) : path;
    spec.data.tokenizer = model_;
    spec.data.overlong = overlong;
    return spec;
  }

  // The tool's ids of `text` (no BOS or EOS).
  std::vector<int64_t> Encode(const std::string& text) {
    const stagecoach::testing::CommandResult r = stagecoach::testing::RunCommand(
        {ToolPath(), "encode", "--text", text, "--tokenizer", model_}, absl::Seconds(60));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::vector<int64_t> ids;
    for (absl::string_view id : absl::StrSplit(r.out, absl::ByAnyChar(" \n"), absl::SkipEmpty())) {
      ids.push_back(std::stoll(std::string(id)));
    }
    return ids;
  }

  stagecoach::testing::TempDir dir_;
  std::string model_;
  // The model's BOS and EOS (stagecoach-sentencepiece train makes Llama 2's: bos 1, eos 2).
  const int64_t bos_ = 1, eos_ = 2;
};

TEST_F(JsonlRecordsTest, ARecordIsBosPromptResponseEosAndOnlyTheResponseCounts) {
  const spec::JobSpec spec =
      Spec(R"({"prompt": "what is the stage of worker 3?", "response": "the stage is 2", "id": 7})"
           "\n\n"
           R"({"prompt": "what", "response": "the loss fell."})"
           "\n");
  auto records = ReadJsonlRecords(spec, kSeq, 320);
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->records.size(), 2u);
  EXPECT_EQ(records->read, 2);
  EXPECT_EQ(records->eos, eos_);
  std::vector<int64_t> want = {bos_};
  const std::vector<int64_t> prompt = Encode("what is the stage of worker 3?");
  const std::vector<int64_t> response = Encode("the stage is 2");
  want.insert(want.end(), prompt.begin(), prompt.end());
  want.insert(want.end(), response.begin(), response.end());
  want.push_back(eos_);
  const DocumentSpan first = records->records[0];
  EXPECT_EQ(std::vector<int64_t>(records->tokens.begin() + first.begin,
                                 records->tokens.begin() + first.end),
            want);
  std::vector<uint8_t> counted(1 + prompt.size(), 0);
  counted.insert(counted.end(), response.size() + 1, 1);
  EXPECT_EQ(std::vector<uint8_t>(records->counted.begin() + first.begin,
                                 records->counted.begin() + first.end),
            counted);

  // In a row, the prompt's targets are hidden and the response's (with the EOS) are kept.
  const Batch b = DocumentRows(records->tokens, {first}, records->eos, /*pack=*/false, 1, kSeq, 0,
                               0, &records->counted);
  const int64_t positions = static_cast<int64_t>(want.size()) - 1;
  for (int64_t i = 0; i < positions; ++i) {
    const int64_t target = b.targets[0][i].item<int64_t>();
    if (i + 1 <= static_cast<int64_t>(prompt.size())) {
      EXPECT_EQ(target, kIgnoredTarget) << "position " << i << " predicts the prompt";
    } else {
      EXPECT_EQ(target, want[i + 1]) << "position " << i;
    }
  }
  EXPECT_EQ(CountedTokens(b.targets), static_cast<int64_t>(response.size()) + 1);
}

TEST_F(JsonlRecordsTest, OverlongRecordsAreTruncatedSkippedOrFailTheJobNamingTheLine) {
  std::string longer = "the stage is";
  for (int i = 0; i < 20; ++i) absl::StrAppend(&longer, " ", i, " and the loss fell");
  const std::string lines =
      absl::StrCat(R"({"prompt": "what", "response": "the stage is 1"})", "\n",
                   R"({"prompt": "what", "response": "the loss fell"})", "\n",
                   R"({"prompt": "what", "response": ")", longer, R"("})", "\n");
  auto truncated = ReadJsonlRecords(Spec(lines, "truncate"), kSeq, 320);
  ASSERT_TRUE(truncated.ok()) << truncated.status();
  EXPECT_EQ(truncated->records.size(), 3u);
  EXPECT_EQ(truncated->truncated, 1);
  EXPECT_EQ(truncated->skipped, 0);
  auto skipped = ReadJsonlRecords(Spec(lines, "skip"), kSeq, 320);
  ASSERT_TRUE(skipped.ok()) << skipped.status();
  EXPECT_EQ(skipped->records.size(), 2u);
  EXPECT_EQ(skipped->read, 3);
  EXPECT_EQ(skipped->skipped, 1);
  auto failed = ReadJsonlRecords(Spec(lines, "fail"), kSeq, 320);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(failed.status().message(), HasSubstr("train.jsonl' line 3: the record has "));
  EXPECT_THAT(failed.status().message(), HasSubstr("more than the window of 24"));
  // The source reports what it made of the file (the job's status shows it).
  auto source = BatchSource::Open(Spec(lines, "skip"), true, true);
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ((*source)->records().read, 3);
  EXPECT_EQ((*source)->records().skipped, 1);
}

TEST_F(JsonlRecordsTest, BadLinesAndFieldsAreRefusedNamingTheLine) {
  auto error = [&](const std::string& lines, spec::JobSpec spec) {
    spec.data.path = Write("bad.jsonl", lines);
    return std::string(ReadJsonlRecords(spec, kSeq, 320).status().message());
  };
  const spec::JobSpec base = Spec("");
  EXPECT_THAT(error("{\"prompt\": \"a\", \"response\": \"b\"}\n{not json\n", base),
              HasSubstr("bad.jsonl' line 2: not a JSON object"));
  EXPECT_THAT(error("{\"prompt\": \"a\"}\n", base), HasSubstr("line 1: no string \"response\""));
  EXPECT_THAT(error("{\"prompt\": 3, \"response\": \"b\"}\n", base),
              HasSubstr("line 1: no string \"prompt\""));
  EXPECT_THAT(error("\n", base), HasSubstr("holds no record to train on"));
  spec::JobSpec fields = base;
  fields.data.prompt_field = "question";
  fields.data.response_field = "answer";
  EXPECT_EQ(error("{\"question\": \"a\", \"answer\": \"b\"}\n", fields), "");
  spec::JobSpec small = base;
  EXPECT_THAT(std::string(ReadJsonlRecords(small, kSeq, 50).status().message()),
              HasSubstr("more than the model's vocabulary of 50"));
  spec::JobSpec missing = base;
  missing.data.tokenizer = dir_.path() + "/none.model";
  EXPECT_THAT(error("{}\n", missing), HasSubstr("data.tokenizer: "));
  EXPECT_THAT(error("{}\n", missing), HasSubstr("none.model"));
  EXPECT_THAT(
      std::string(ReadJsonlRecords(Spec("", "truncate", dir_.path() + "/none.jsonl"), kSeq, 320)
                      .status()
                      .message()),
      HasSubstr("data.path: cannot read '"));
}

// Without the tool the job fails saying where the worker looked for it.
TEST_F(JsonlRecordsTest, AMissingToolIsNamed) {
  const spec::JobSpec spec = Spec(R"({"prompt": "a", "response": "b"})"
                                  "\n");
  setenv("STAGECOACH_SENTENCEPIECE_TOOL", (dir_.path() + "/no-such-tool").c_str(), 1);
  const absl::Status status = ReadJsonlRecords(spec, kSeq, 320).status();
  setenv("STAGECOACH_SENTENCEPIECE_TOOL", ToolPath().c_str(), 1);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(status.message()), HasSubstr("no-such-tool records exited 127"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("STAGECOACH_SENTENCEPIECE_TOOL"));
}

}  // namespace
}  // namespace stagecoach::runtime::jsonl_records_test
