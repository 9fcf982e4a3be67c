#include "client/generate_command.h"

#include <nlohmann/json.hpp>
#include <ostream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/render/render.h"
#include "client/tokens/tokens_command.h"
#include "common/rpc/channel.h"
#include "common/rpc/time_conversion.h"
#include "stagecoach/v1/generation.grpc.pb.h"

namespace stagecoach::client {
namespace {

int Usage(std::ostream& err, const std::string& message) {
  err << "stagectl: generate: " << message << "\n";
  return 2;
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
  if (o.tokens < 1) return Usage(err, absl::StrCat("--tokens: must be >= 1, got ", o.tokens));
  if (o.prompt.empty()) return Usage(err, "--prompt: needs at least one character");
  auto vocab = ReadVocabularyFile(o.vocab_path);
  if (!vocab.ok()) return Usage(err, absl::StrCat("--vocab: ", vocab.status().message()));
  auto prompt = vocab->Encode(o.prompt, "--prompt");
  if (!prompt.ok()) return Usage(err, std::string(prompt.status().message()));

  v1::GenerateRequest request;
  request.set_job_id(o.job_id);
  for (uint16_t t : *prompt) request.add_prompt(t);
  request.set_tokens(o.tokens);
  request.set_temperature(o.temperature);
  request.set_top_k(o.top_k);
  request.set_seed(o.seed);
  *request.mutable_timeout() = rpc::ToProtoDuration(timeout);

  auto stub = v1::GenerationService::NewStub(rpc::MakeChannel(client.coordinator, client.security));
  grpc::ClientContext ctx;
  rpc::SetDeadline(&ctx, timeout + absl::Seconds(30));  // the server's own bound ends it first
  auto reader = stub->Generate(&ctx, request);
  const bool table = client.format == OutputFormat::kTable;
  if (table) out << o.prompt << std::flush;
  std::vector<uint16_t> tokens;
  std::string ran_on = o.job_id, text;
  int64_t weights_step = 0;
  v1::GenerateResponse message;
  while (reader->Read(&message)) {
    if (!message.ran_on_job().empty()) {
      ran_on = message.ran_on_job();
      weights_step = message.weights_step();
    }
    for (int32_t t : message.tokens()) {
      tokens.push_back(static_cast<uint16_t>(t));
      auto piece = vocab->Decode({static_cast<uint16_t>(t)}, "the coordinator's tokens");
      if (!piece.ok()) {
        ctx.TryCancel();
        err << "\nstagectl: generate: " << piece.status().message()
            << " (is --vocab the job's vocabulary?)\n";
        return 1;
      }
      text += *piece;
      if (table) out << *piece << std::flush;
    }
  }
  const grpc::Status status = reader->Finish();
  if (table) out << "\n";
  if (!status.ok()) {
    return ReportRpcError(err, client.coordinator, status, absl::StrCat("generate ", o.job_id));
  }
  if (!table) {
    nlohmann::json json = {
        {"job_id", o.job_id}, {"ran_on_job", ran_on}, {"weights_step", weights_step},
        {"prompt", o.prompt}, {"tokens", tokens},     {"text", text}};
    out << Render(client.format, json, "");
    return 0;
  }
  err << "generated " << tokens.size() << " tokens from " << o.job_id << " at step " << weights_step
      << (ran_on == o.job_id ? "" : absl::StrCat(" (on ", ran_on, ")")) << "\n";
  return 0;
}

}  // namespace stagecoach::client
