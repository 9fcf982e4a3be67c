// `stagectl tokens` with a SentencePiece model, run as users run it (stagectl, which execs
// stagecoach-sentencepiece: client/tokens/tokens_command.h), held to Debian's python3-sentencepiece on
// the same model and text: a model trained from the test's own text;
// encode's ids (with and without --bos/--eos) equal the Python binding's; build puts EOS after
// every document and writes uint16 or uint32 ids; decode gives the text back exactly; bad
// arguments and files are refused naming them.
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/support/test_paths.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/process.h"
#include "tests/support/python.h"
#include "tests/support/temp_dir.h"

namespace stagecoach::sentencepiece_tokens_test {
namespace {

using ::testing::HasSubstr;

// Prose-like text: sentences of words from a small lexicon, some digits and non-ASCII.
std::string Text(uint32_t seed, int sentences) {
  static const char* kWords[] = {"the",   "pipeline", "stage", "worker", "tokens", "model",
                                 "train", "loss",     "fell",  "quickly", "and",   "slowly",
                                 "every", "schedule", "café",  "naïve",  "über",  "step"};
  std::mt19937 rng(seed);
  std::string out;
  for (int s = 0; s < sentences; ++s) {
    const int n = 4 + static_cast<int>(rng() % 8);
    for (int w = 0; w < n; ++w) {
      absl::StrAppend(&out, w == 0 ? "" : " ", kWords[rng() % std::size(kWords)]);
    }
    absl::StrAppend(&out, " ", rng() % 1000, ".", s % 5 == 4 ? "\n" : " ");
  }
  return out;
}

std::vector<int64_t> Ids(const std::string& text) {
  std::vector<int64_t> ids;
  for (absl::string_view id : absl::StrSplit(text, absl::ByAnyChar(" \n"), absl::SkipEmpty())) {
    ids.push_back(std::stoll(std::string(id)));
  }
  return ids;
}

class SentencePieceTokens : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::PythonCanImport("sentencepiece")) {
      GTEST_SKIP() << "python3-sentencepiece is not installed";
    }
    model_ = dir_ + "/tokenizer.model";
    ASSERT_EQ(Run({"train", Write("train.txt", Text(1, 3000)), "--vocab-size", "400", "--out",
                   model_}),
              0)
        << err_;
  }

  std::string Write(const std::string& name, const std::string& contents) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << contents;
    return path;
  }
  std::string Read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  // `stagectl tokens ARGS...`: its exit code; stdout in out_, stderr in err_.
  int Run(std::vector<std::string> args) {
    args.insert(args.begin(), {testing::BinaryDir() + "/client/stagectl", "tokens"});
    const testing::CommandResult r = testing::RunCommand(args, absl::Seconds(120));
    out_ = r.out;
    err_ = r.err;
    return r.exit_code;
  }
  // python3-sentencepiece's ids of the file `path`, with BOS/EOS as asked.
  std::vector<int64_t> PythonIds(const std::string& path, bool bos, bool eos) {
    const std::string script = absl::StrCat(
        "import sentencepiece as spm, sys\n"
        "sp = spm.SentencePieceProcessor(model_file=sys.argv[1])\n"
        "ids = sp.encode(open(sys.argv[2], encoding='utf-8', newline='').read())\n",
        bos ? "ids = [sp.bos_id()] + ids\n" : "", eos ? "ids = ids + [sp.eos_id()]\n" : "",
        "print(' '.join(map(str, ids)))\n");
    const testing::CommandResult r =
        testing::RunCommand({testing::kPython, "-c", script, model_, path}, absl::Seconds(60));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return Ids(r.out);
  }
  testing::TempDir temp_{"stagecoach-spm"};
  const std::string dir_ = temp_.path();
  std::string model_;
  std::string out_, err_;
};

TEST_F(SentencePieceTokens, EncodeEqualsPythonsSentencePiece) {
  const std::string held_out = Write("held_out.txt", Text(2, 40) + "Zürich 2026 ∑ done");
  for (const auto& [bos, eos] : {std::pair{false, false}, {true, false}, {true, true}}) {
    std::vector<std::string> args = {"encode", held_out, "--tokenizer", model_};
    if (bos) args.push_back("--bos");
    if (eos) args.push_back("--eos");
    ASSERT_EQ(Run(args), 0) << err_;
    const std::vector<int64_t> ours = Ids(out_);
    EXPECT_EQ(ours, PythonIds(held_out, bos, eos)) << "bos " << bos << ", eos " << eos;
    EXPECT_GT(ours.size(), 100u);
  }
  ASSERT_EQ(Run({"encode", "--text", "the pipeline stage", "--tokenizer", model_}), 0) << err_;
  EXPECT_EQ(Ids(out_), PythonIds(Write("short.txt", "the pipeline stage"), false, false));
}

TEST_F(SentencePieceTokens, BuildPutsEosBetweenDocumentsAndDecodeGivesTheTextBack) {
  const std::string a = Write("a.txt", Text(3, 30)), b = Write("b.txt", "über 42 café ∑\n");
  for (const std::string dtype : {"uint16", "uint32"}) {
    const std::string tokens = dir_ + "/tokens-" + dtype + ".bin";
    ASSERT_EQ(Run({"build", a, b, "--tokenizer", model_, "--dtype", dtype, "--out", tokens}), 0)
        << err_;
    std::vector<int64_t> want = PythonIds(a, false, true);
    const std::vector<int64_t> second = PythonIds(b, false, true);
    want.insert(want.end(), second.begin(), second.end());
    const std::string bytes = Read(tokens);
    const size_t width = dtype == "uint32" ? 4 : 2;
    ASSERT_EQ(bytes.size(), want.size() * width);
    std::vector<int64_t> got(want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      for (size_t k = 0; k < width; ++k) {
        got[i] |= static_cast<int64_t>(static_cast<unsigned char>(bytes[i * width + k])) << (8 * k);
      }
    }
    EXPECT_EQ(got, want);
    EXPECT_EQ(got.back(), 2);  // EOS

    ASSERT_EQ(Run({"decode", tokens, "--tokenizer", model_, "--dtype", dtype}), 0) << err_;
    EXPECT_EQ(out_, Read(a) + Read(b));
  }
}

TEST_F(SentencePieceTokens, RefusesBadArgumentsAndFilesNamingThem) {
  EXPECT_EQ(Run({"encode", "--text", "x", "--tokenizer", model_, "--vocab", "v.json"}), 2);
  EXPECT_THAT(err_, HasSubstr("two kinds of tokenizer"));
  const std::string c = Write("c.txt", "the");
  EXPECT_EQ(Run({"build", c, "--tokenizer", model_, "--out", dir_ + "/c.bin", "--bos"}), 2);
  EXPECT_THAT(err_, HasSubstr("--bos and --eos go with encode"));
  EXPECT_EQ(Run({"build", c, "--tokenizer", model_, "--out", dir_ + "/c.bin", "--dtype", "int8"}),
            2);
  EXPECT_THAT(err_, HasSubstr("--dtype int8: must be uint16 or uint32"));
  EXPECT_EQ(Run({"encode", "--text", "x", "--tokenizer", Write("not-a-model", "hello")}), 3);
  EXPECT_THAT(err_, HasSubstr(absl::StrCat("tokenizer ", dir_,
                                           "/not-a-model: not a SentencePiece model")));
  EXPECT_EQ(Run({"decode", Write("odd.bin", "abc"), "--tokenizer", model_}), 1);
  EXPECT_THAT(err_, HasSubstr("odd.bin has 3 bytes, not a whole number of uint16s"));
  EXPECT_EQ(Run({"decode", Write("big.bin", std::string("\xff\xff", 2)), "--tokenizer", model_}),
            1);
  EXPECT_THAT(err_, HasSubstr("token 0 is 65535, outside"));
  EXPECT_EQ(Run({"train", Write("tiny.txt", "ab"), "--vocab-size", "5000", "--out",
                 dir_ + "/tiny.model"}),
            1);
  EXPECT_THAT(err_, HasSubstr("training a tokenizer of 5000 pieces on"));
}

}  // namespace
}  // namespace stagecoach::sentencepiece_tokens_test
