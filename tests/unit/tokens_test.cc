// The character vocabulary (common/text/char_vocabulary.h) and `stagectl tokens`
// (client/tokens/tokens_command.h): text round-trips through tokens, ids follow code point order, the
// token file is little-endian uint16, and bad text, vocabularies, token files and arguments are
// refused naming what is wrong and where.
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "client/tokens/tokens_command.h"
#include "common/text/char_vocabulary.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace stagecoach::tokens_test {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using text::CharVocabulary;

TEST(CharVocabulary, RoundTripsTextWithIdsInCodePointOrder) {
  const std::string prose =
      "Fools rush in\nwhere angels fear to tread. Caf\xC3\xA9 \xE2\x82\xAC 5!";
  auto vocab = CharVocabulary::FromText(prose, "prose");
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  EXPECT_EQ(vocab->Char(0), "\n");
  EXPECT_EQ(vocab->Char(1), " ");
  EXPECT_EQ(vocab->Char(vocab->size() - 2), "\xC3\xA9");      // U+00E9
  EXPECT_EQ(vocab->Char(vocab->size() - 1), "\xE2\x82\xAC");  // U+20AC
  auto tokens = vocab->Encode(prose, "prose");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(tokens->size(), 51u);  // characters, not bytes
  auto back = vocab->Decode(*tokens, "tokens");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, prose);

  // Through the file: the same characters in the same order.
  auto reread = CharVocabulary::Parse(vocab->ToJson(), "vocab.json");
  ASSERT_TRUE(reread.ok()) << reread.status();
  ASSERT_EQ(reread->size(), vocab->size());
  for (int i = 0; i < vocab->size(); ++i) EXPECT_EQ(reread->Char(i), vocab->Char(i));
}

TEST(CharVocabulary, TokenBytesAreLittleEndianUint16) {
  const std::vector<uint16_t> tokens = {1, 258, 65535};
  const std::string bytes = text::TokenBytes(tokens);
  EXPECT_EQ(bytes, std::string("\x01\x00\x02\x01\xFF\xFF", 6));
  auto parsed = text::ParseTokenBytes(bytes, "t.bin");
  ASSERT_TRUE(parsed.ok());
  EXPECT_THAT(*parsed, ElementsAre(1, 258, 65535));
  EXPECT_THAT(std::string(text::ParseTokenBytes("abc", "t.bin").status().message()),
              HasSubstr("t.bin: 3 bytes, an odd number"));
}

TEST(CharVocabulary, RefusesWhatItCannotTokenizeNamingWhere) {
  EXPECT_THAT(std::string(CharVocabulary::FromText("", "a.txt").status().message()),
              HasSubstr("a.txt: no text"));
  const auto bad = CharVocabulary::FromText("ok\nab\xFF", "a.txt").status();
  EXPECT_TRUE(absl::IsInvalidArgument(bad));
  EXPECT_THAT(std::string(bad.message()),
              HasSubstr("a.txt: not UTF-8 text: line 2, column 3 (byte 5): 0xFF"));

  auto vocab = CharVocabulary::FromText("abc\n", "a.txt");
  ASSERT_TRUE(vocab.ok());
  EXPECT_THAT(std::string(vocab->Encode("ab\ncab\xC3\xA9", "--text").status().message()),
              HasSubstr("--text: line 2, column 4: U+00E9 '\xC3\xA9' is not in the vocabulary "
                        "(4 characters)"));
  const std::vector<uint16_t> tokens = {0, 1, 4};
  EXPECT_THAT(std::string(vocab->Decode(tokens, "t.bin").status().message()),
              HasSubstr("t.bin: token 4 at position 2 is not below the vocabulary's 4 "
                        "characters"));
}

TEST(CharVocabulary, RefusesABrokenVocabularyFileNamingTheEntry) {
  const auto message = [](const std::string& json) {
    return std::string(CharVocabulary::Parse(json, "v.json").status().message());
  };
  EXPECT_THAT(message("[1, 2]"), HasSubstr("v.json: not a vocabulary file"));
  EXPECT_THAT(message(R"({"format": "gpt2-bpe", "version": 1, "chars": ["a"]})"),
              HasSubstr("\"format\" is not \"stagecoach-chars\""));
  EXPECT_THAT(message(R"({"format": "stagecoach-chars", "version": 2, "chars": ["a"]})"),
              HasSubstr("\"version\" must be 1"));
  EXPECT_THAT(message(R"({"format": "stagecoach-chars", "version": 1, "chars": []})"),
              HasSubstr("\"chars\" must be a non-empty list"));
  EXPECT_THAT(message(R"({"format": "stagecoach-chars", "version": 1, "chars": ["a", "bc"]})"),
              HasSubstr("v.json: chars[1] is \"bc\": each entry is exactly one character"));
  EXPECT_THAT(message(R"({"format": "stagecoach-chars", "version": 1, "chars": ["a", 7]})"),
              HasSubstr("v.json: chars[1] is not a string"));
  EXPECT_THAT(message(R"({"format": "stagecoach-chars", "version": 1, "chars": ["a", "b", "a"]})"),
              HasSubstr("v.json: chars[2] is U+0061 'a', which is listed before"));
}

class TokensCommandTest : public ::testing::Test {
 protected:
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
  int Run(client::TokensCommandOptions o) {
    out_.str("");
    err_.str("");
    return client::RunTokens(o, out_, err_);
  }

  testing::TempDir temp_{"stagecoach-tokens"};
  const std::string dir_ = temp_.path();
  std::ostringstream out_, err_;
};

TEST_F(TokensCommandTest, BuildThenDecodeGivesTheFilesBack) {
  const std::string a = Write("a.txt", "To be, or not to be:\n");
  const std::string b = Write("b.txt", "that is the question.\n");
  client::TokensCommandOptions build{
      "build", {a, b}, std::nullopt, dir_ + "/vocab.json", dir_ + "/tokens.bin"};
  ASSERT_EQ(Run(build), 0) << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("43 characters of 2 files, 18 distinct"));
  EXPECT_THAT(out_.str(), HasSubstr("model.builtin.vocab: 18"));
  EXPECT_EQ(Read(dir_ + "/tokens.bin").size(), 86u);

  client::TokensCommandOptions decode{
      "decode", {dir_ + "/tokens.bin"}, std::nullopt, dir_ + "/vocab.json", ""};
  ASSERT_EQ(Run(decode), 0) << err_.str();
  EXPECT_EQ(out_.str(), "To be, or not to be:\nthat is the question.\n");

  // Encode with the same vocabulary: ids on stdout, or a token file equal to build's.
  client::TokensCommandOptions ids{"encode", {}, std::string("be"), dir_ + "/vocab.json", ""};
  ASSERT_EQ(Run(ids), 0) << err_.str();
  auto vocab = CharVocabulary::Parse(Read(dir_ + "/vocab.json"), "vocab.json");
  ASSERT_TRUE(vocab.ok());
  auto be = vocab->Encode("be", "be");
  ASSERT_TRUE(be.ok());
  EXPECT_EQ(out_.str(), std::to_string((*be)[0]) + " " + std::to_string((*be)[1]) + "\n");
  client::TokensCommandOptions file{
      "encode", {a, b}, std::nullopt, dir_ + "/vocab.json", dir_ + "/again.bin"};
  ASSERT_EQ(Run(file), 0) << err_.str();
  EXPECT_EQ(Read(dir_ + "/again.bin"), Read(dir_ + "/tokens.bin"));
}

TEST_F(TokensCommandTest, RefusesBadArgumentsAndFilesNamingThem) {
  const std::string a = Write("a.txt", "abc\n");
  const std::string vocab = dir_ + "/vocab.json";
  EXPECT_EQ(Run({"split", {a}, std::nullopt, vocab, "t.bin"}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("'split' is not an action: build, encode or decode"));
  EXPECT_EQ(Run({"build", {a}, std::nullopt, vocab, ""}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("build needs --out FILE"));
  EXPECT_EQ(Run({"encode", {a}, std::string("x"), vocab, ""}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("encode needs text files or --text, one"));

  EXPECT_EQ(Run({"build", {dir_ + "/missing.txt"}, std::nullopt, vocab, dir_ + "/t.bin"}), 1);
  EXPECT_THAT(err_.str(), HasSubstr("cannot read text file " + dir_ + "/missing.txt"));
  const std::string latin1 = Write("latin1.txt", "caf\xE9\n");
  EXPECT_EQ(Run({"build", {a, latin1}, std::nullopt, vocab, dir_ + "/t.bin"}), 1);
  EXPECT_THAT(err_.str(), HasSubstr(latin1 + ": not UTF-8 text: line 1, column 4 (byte 3)"));

  ASSERT_EQ(Run({"build", {a}, std::nullopt, vocab, dir_ + "/t.bin"}), 0) << err_.str();
  const std::string other = Write("other.txt", "abd\n");
  EXPECT_EQ(Run({"encode", {other}, std::nullopt, vocab, dir_ + "/o.bin"}), 1);
  EXPECT_THAT(err_.str(),
              HasSubstr(other + ": line 1, column 3: U+0064 'd' is not in the vocabulary"));
  const std::string odd = Write("odd.bin", "abc");
  EXPECT_EQ(Run({"decode", {odd}, std::nullopt, vocab, ""}), 1);
  EXPECT_THAT(err_.str(), HasSubstr(odd + ": 3 bytes, an odd number"));
}

}  // namespace
}  // namespace stagecoach::tokens_test
