// Byte counts for people (common/util/byte_size.h), both ways.
#include "common/util/byte_size.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagecoach::util::byte_size_test {
namespace {

using ::testing::HasSubstr;

TEST(FormatBytes, BinaryUnits) {
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(3.0 * (1 << 30)), "3.0 GiB");
  EXPECT_EQ(FormatBytes(-5), "-5 B");
}

TEST(ParseBytes, NumbersAndUnits) {
  EXPECT_EQ(*ParseBytes("1048576"), 1048576);
  EXPECT_EQ(*ParseBytes("8GiB"), 8LL << 30);
  EXPECT_EQ(*ParseBytes("1.5 gib"), 3LL << 29);
  EXPECT_EQ(*ParseBytes(" 512MiB "), 512LL << 20);
  EXPECT_EQ(*ParseBytes("2GB"), 2000000000);
  EXPECT_EQ(*ParseBytes("10 kb"), 10000);
  EXPECT_EQ(*ParseBytes("7B"), 7);
  EXPECT_EQ(*ParseBytes("1TiB"), 1LL << 40);
}

TEST(ParseBytes, RefusesWhatIsNoSize) {
  for (const char* bad : {"", "GiB", "lots", "8 GiBs", "-1GiB", "1e3", "1.2.3MiB", "8 PiB"}) {
    auto parsed = ParseBytes(bad);
    EXPECT_FALSE(parsed.ok()) << bad;
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("is not a byte size")) << bad;
  }
  EXPECT_THAT(std::string(ParseBytes("9000000TiB").status().message()),
              HasSubstr("is over 2^63-1 bytes"));
}

}  // namespace
}  // namespace stagecoach::util::byte_size_test
