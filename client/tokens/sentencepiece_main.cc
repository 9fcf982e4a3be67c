// stagecoach-sentencepiece: `stagectl tokens` with a SentencePiece model (sentencepiece_tokens.h).
// stagectl execs it with the options it was given; it also runs on its own.
#include <iostream>

#include "CLI/CLI.hpp"
#include "client/tokens/sentencepiece_tokens.h"

int main(int argc, char** argv) {
  stagecoach::client::TokensCommandOptions o;
  CLI::App app{"text to the tokens a built-in decoder trains on, and back, with a SentencePiece "
               "model (what `stagectl tokens --tokenizer` and `stagectl tokens train` run)",
               "stagecoach-sentencepiece"};
  app.add_option("action", o.action, "train, build, encode, decode or records")->required();
  app.add_option("files", o.inputs, "text files (train, build, encode) or a token file (decode)");
  app.add_option("--text", o.text, "encode this text instead of files");
  app.add_option("--tokenizer", o.tokenizer_path, "the SentencePiece model (tokenizer.model)");
  app.add_option("--vocab-size", o.vocab_size, "train: the model's pieces");
  app.add_flag("--bos", o.bos, "encode: begin with the BOS id");
  app.add_flag("--eos", o.eos, "encode: end with the EOS id");
  app.add_option("--dtype", o.dtype, "token files of uint16 (default) or uint32 ids");
  app.add_option("--prompt-field", o.prompt_field, "records: the prompt's key (default prompt)");
  app.add_option("--response-field", o.response_field,
                 "records: the response's key (default response)");
  app.add_option("--out", o.out_path, "the model (train), tokens (build, encode) or text (decode)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return stagecoach::client::RunSentencePieceTokens(o, std::cout, std::cerr);
}
