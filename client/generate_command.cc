#include "client/generate_command.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "client/render/render.h"
#include "client/tokens/sentencepiece_process.h"
#include "client/tokens/tokens_command.h"
#include "common/rpc/channel.h"
#include "common/rpc/time_conversion.h"
#include "common/spec/spec_parser.h"
#include "stagecoach/v1/coordinator.grpc.pb.h"
#include "stagecoach/v1/generation.grpc.pb.h"

namespace stagecoach::client {
namespace {

int Usage(std::ostream& err, const std::string& message) {
  err << "stagectl: generate: " << message << "\n";
  return 2;
}

// The tokenizer of a run: a character vocabulary, a SentencePiece model, or none (ids only).
struct Tokenizer {
  std::optional<text::CharVocabulary> chars;
  std::string sentencepiece;
  bool any() const { return chars.has_value() || !sentencepiece.empty(); }

  absl::StatusOr<std::vector<int32_t>> Encode(const std::string& text,
                                              const std::string& field) const {
    if (!chars.has_value()) return EncodeWithTokenizer(sentencepiece, text);
    absl::StatusOr<std::vector<uint16_t>> ids = chars->Encode(text, field);
    if (!ids.ok()) return ids.status();
    return std::vector<int32_t>(ids->begin(), ids->end());
  }

  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const {
    if (!chars.has_value()) return DecodeWithTokenizer(sentencepiece, ids);
    return chars->Decode(std::vector<uint16_t>(ids.begin(), ids.end()),
                         "the coordinator's tokens");
  }

  // The text `tokens` add after `prompt`. SentencePiece drops the space a text's first piece
  // starts with ("▁a" alone is "a"), so the tokens are decoded after the prompt and the
  // prompt's own text taken off.
  absl::StatusOr<std::string> Continuation(const std::vector<int32_t>& prompt,
                                           const std::vector<int32_t>& tokens) const {
    if (chars.has_value() || prompt.empty()) return Decode(tokens);
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), tokens.begin(), tokens.end());
    absl::StatusOr<std::string> whole = Decode(all);
    absl::StatusOr<std::string> before = Decode(prompt);
    if (!whole.ok()) return whole.status();
    if (!before.ok()) return before.status();
    if (absl::StartsWith(*whole, *before)) return whole->substr(before->size());
    return Decode(tokens);
  }
};

// DIR/tokenizer.model of a job whose model is model.hf {path: DIR}, when this machine has that
// file; empty otherwise (an unreachable job is reported by Generate itself).
std::string JobTokenizer(const std::string& job_id, const ClientOptions& client) {
  auto stub =
      v1::CoordinatorService::NewStub(rpc::MakeChannel(client.coordinator, client.security));
  grpc::ClientContext ctx;
  rpc::SetDeadline(&ctx, client.timeout);
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  v1::GetJobResponse response;
  if (!stub->GetJob(&ctx, request, &response).ok()) return "";
  absl::StatusOr<spec::JobSpec> spec = spec::ParseJobSpec(response.job().spec_yaml(), job_id);
  if (!spec.ok() || !spec->model.hf.has_value()) return "";
  const std::filesystem::path model = std::filesystem::path(spec->model.hf->path) / "tokenizer.model";
  std::error_code ec;
  return std::filesystem::is_regular_file(model, ec) ? model.string() : "";
}

absl::StatusOr<std::vector<int32_t>> ParseIds(const std::string& text, const std::string& field) {
  std::vector<int32_t> ids;
  for (absl::string_view word : absl::StrSplit(text, absl::ByAnyChar(" ,\t"), absl::SkipEmpty())) {
    int32_t id;
    if (!absl::SimpleAtoi(word, &id) || id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": '", word, "' is not a token id (a non-negative integer)"));
    }
    ids.push_back(id);
  }
  if (ids.empty()) return absl::InvalidArgumentError(field + ": needs at least one token id");
  return ids;
}

// One row of the run: its prompt and what came back.
struct Row {
  std::string prompt;
  std::vector<int32_t> prompt_ids, tokens;
  std::string text;
};

// The options' checks, the tokenizer and every row's prompt ids. 0 when they are good, else
// the exit code (the reason on `err`).
int PrepareRows(const GenerateOptions& o, const ClientOptions& client, std::ostream& err,
                Tokenizer* tokenizer, std::vector<Row>* rows) {
  if (o.tokens < 1) return Usage(err, absl::StrCat("--tokens: must be >= 1, got ", o.tokens));
  if (o.prompts.empty() == o.prompt_ids.empty()) {
    return Usage(err, "give --prompt TEXT or --prompt-ids \"ID ...\" (each may repeat), not both");
  }
  if (!o.vocab_path.empty() && !o.tokenizer_path.empty()) {
    return Usage(err, "--vocab (a character vocabulary) and --tokenizer (SentencePiece) are two "
                      "kinds of tokenizer; give one");
  }
  if (!o.vocab_path.empty()) {
    auto vocab = ReadVocabularyFile(o.vocab_path);
    if (!vocab.ok()) return Usage(err, absl::StrCat("--vocab: ", vocab.status().message()));
    tokenizer->chars = *std::move(vocab);
  } else {
    tokenizer->sentencepiece =
        o.tokenizer_path.empty() ? JobTokenizer(o.job_id, client) : o.tokenizer_path;
  }
  if (!o.prompts.empty() && !tokenizer->any()) {
    return Usage(err, "--prompt needs a tokenizer: --vocab, --tokenizer, or a model.hf job whose "
                      "directory holds tokenizer.model (or give --prompt-ids)");
  }
  for (const std::string& p : o.prompts) {
    if (p.empty()) return Usage(err, "--prompt: needs at least one character");
    auto ids = tokenizer->Encode(p, "--prompt");
    if (!ids.ok()) {
      err << "stagectl: generate: " << ids.status().message() << "\n";
      return tokenizer->chars.has_value() ? 2 : 1;
    }
    rows->push_back(Row{p, *ids, {}, ""});
  }
  for (const std::string& p : o.prompt_ids) {
    auto ids = ParseIds(p, "--prompt-ids");
    if (!ids.ok()) return Usage(err, std::string(ids.status().message()));
    rows->push_back(Row{"", *ids, {}, ""});
  }
  return 0;
}

v1::GenerateRequest RequestOf(const GenerateOptions& o, const std::vector<Row>& rows,
                              absl::Duration timeout) {
  v1::GenerateRequest request;
  request.set_job_id(o.job_id);
  if (rows.size() == 1) {
    for (int32_t t : rows[0].prompt_ids) request.add_prompt(t);
  } else {
    for (const Row& row : rows) {
      v1::TokenIds* ids = request.add_prompts();
      for (int32_t t : row.prompt_ids) ids->add_ids(t);
    }
  }
  request.set_tokens(o.tokens);
  request.set_temperature(o.temperature);
  request.set_top_k(o.top_k);
  request.set_seed(o.seed);
  *request.mutable_timeout() = rpc::ToProtoDuration(timeout);
  return request;
}

// What a finished generation prints (the streamed text, if any, is out already).
void PrintResult(const GenerateOptions& o, const ClientOptions& client, bool streamed,
                 const Tokenizer& tokenizer, const std::vector<Row>& rows,
                 const std::string& ran_on, int64_t weights_step, std::ostream& out,
                 std::ostream& err) {
  if (client.format != OutputFormat::kTable) {
    nlohmann::json json_rows = nlohmann::json::array();
    for (const Row& row : rows) {
      json_rows.push_back({{"prompt", row.prompt}, {"prompt_ids", row.prompt_ids},
                           {"tokens", row.tokens}, {"text", row.text}});
    }
    nlohmann::json json = {{"job_id", o.job_id},         {"ran_on_job", ran_on},
                           {"weights_step", weights_step}, {"prompt", rows[0].prompt},
                           {"tokens", rows[0].tokens},     {"text", rows[0].text},
                           {"rows", json_rows}};
    out << Render(client.format, json, "");
    return;
  }
  for (const Row& row : rows) {
    if (streamed) break;
    if (tokenizer.any()) {
      out << (row.prompt.empty() ? absl::StrJoin(row.prompt_ids, " ") + " |" : row.prompt)
          << row.text << "\n";
    } else {
      out << absl::StrJoin(row.prompt_ids, " ") << " | " << absl::StrJoin(row.tokens, " ")
          << "\n";
    }
  }
  err << "generated " << rows[0].tokens.size() << " tokens"
      << (rows.size() > 1 ? absl::StrCat(" for each of ", rows.size(), " prompts") : "")
      << " from " << o.job_id << " at step " << weights_step
      << (ran_on == o.job_id ? "" : absl::StrCat(" (on ", ran_on, ")")) << "\n";
}

}  // namespace

int RunGenerate(const GenerateOptions& o, const ClientOptions& client, std::ostream& out,
                std::ostream& err) {
  absl::Duration timeout;
  if (!absl::ParseDuration(o.timeout, &timeout) || timeout <= absl::ZeroDuration()) {
    return Usage(err, absl::StrCat("--timeout: must be a positive duration such as 30s or 10m, "
                                   "got '",
                                   o.timeout, "'"));
  }
  Tokenizer tokenizer;
  std::vector<Row> rows;
  if (const int code = PrepareRows(o, client, err, &tokenizer, &rows); code != 0) return code;

  auto stub = v1::GenerationService::NewStub(rpc::MakeChannel(client.coordinator, client.security));
  grpc::ClientContext ctx;
  rpc::SetDeadline(&ctx, timeout + absl::Seconds(30));  // the server's own bound ends it first
  auto reader = stub->Generate(&ctx, RequestOf(o, rows, timeout));
  // One prompt and a character vocabulary on a terminal table: the text is printed as it comes.
  const bool streaming = client.format == OutputFormat::kTable && rows.size() == 1 &&
                         tokenizer.chars.has_value();
  if (streaming) out << rows[0].prompt << std::flush;
  std::string ran_on = o.job_id;
  int64_t weights_step = 0;
  v1::GenerateResponse message;
  while (reader->Read(&message)) {
    if (!message.ran_on_job().empty()) {
      ran_on = message.ran_on_job();
      weights_step = message.weights_step();
    }
    for (int i = 0; i < message.tokens_size() && i < static_cast<int>(rows.size()); ++i) {
      rows[i].tokens.push_back(message.tokens(i));
    }
    if (streaming && message.tokens_size() > 0) {
      auto piece = tokenizer.Decode({message.tokens(0)});
      if (!piece.ok()) {
        ctx.TryCancel();
        err << "\nstagectl: generate: " << piece.status().message()
            << " (is --vocab the job's vocabulary?)\n";
        return 1;
      }
      out << *piece << std::flush;
    }
  }
  const grpc::Status status = reader->Finish();
  if (streaming) out << "\n";
  if (!status.ok()) {
    return ReportRpcError(err, client.coordinator, status, absl::StrCat("generate ", o.job_id));
  }
  if (tokenizer.any()) {
    for (Row& row : rows) {
      auto text = tokenizer.Continuation(row.prompt_ids, row.tokens);
      if (!text.ok()) {
        err << "stagectl: generate: " << text.status().message() << "\n";
        return 1;
      }
      row.text = *text;
    }
  }
  PrintResult(o, client, streaming, tokenizer, rows, ran_on, weights_step, out, err);
  return 0;
}

}  // namespace stagecoach::client
