// The sizes of the built-in Llama the benchmarks run (llama_bench, generation_bench): their
// command-line options and the model.builtin keys they give.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "absl/strings/str_cat.h"

namespace stagecoach::bench {

struct LlamaSizes {
  int hidden = 0, intermediate = 0, layers = 0, heads = 0, kv_heads = 0, vocab = 0;
};

// --hidden, --intermediate, --layers, --heads, --kv-heads, --vocab into `sizes`.
inline void AddLlamaSizeOptions(CLI::App& app, LlamaSizes& sizes) {
  app.add_option("--hidden", sizes.hidden, "hidden_size");
  app.add_option("--intermediate", sizes.intermediate, "intermediate_size");
  app.add_option("--layers", sizes.layers, "num_hidden_layers");
  app.add_option("--heads", sizes.heads, "num_attention_heads");
  app.add_option("--kv-heads", sizes.kv_heads, "num_key_value_heads");
  app.add_option("--vocab", sizes.vocab, "vocab_size");
}

// "family: llama, vocab_size: V, hidden_size: H, ..." (without braces).
inline std::string LlamaKeys(const LlamaSizes& s) {
  return absl::StrCat("family: llama, vocab_size: ", s.vocab, ", hidden_size: ", s.hidden,
                      ", intermediate_size: ", s.intermediate, ", num_hidden_layers: ", s.layers,
                      ", num_attention_heads: ", s.heads, ", num_key_value_heads: ", s.kv_heads);
}

}  // namespace stagecoach::bench
