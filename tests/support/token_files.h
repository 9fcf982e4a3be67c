// A synthetic "language" for GPT tests: a token file (data.kind: tokens, little-endian uint16)
// of a few random phrases repeated in random order, which a small GPT learns quickly.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace stagecoach::testing {

// `tokens` or a few more tokens below `vocab`: `phrases` phrases of min_length + (r mod
// length_spread) random tokens each, then phrases picked at random until there are enough; all
// draws from std::mt19937(seed), so the file is the same on every machine.
inline std::string PhraseTokenFile(uint32_t seed, int vocab, int phrases, int min_length,
                                   int length_spread, int tokens) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int>> table(phrases);
  for (auto& p : table) {
    const int len = min_length + static_cast<int>(rng() % length_spread);
    for (int i = 0; i < len; ++i) p.push_back(static_cast<int>(rng() % vocab));
  }
  std::string bytes;
  for (int n = 0; n < tokens;) {
    for (int t : table[rng() % table.size()]) {
      bytes.push_back(static_cast<char>(t & 0xff));
      bytes.push_back(static_cast<char>(t >> 8));
      ++n;
    }
  }
  return bytes;
}

}  // namespace stagecoach::testing
