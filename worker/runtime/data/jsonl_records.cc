#include "worker/runtime/data/jsonl_records.h"

#include <filesystem>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/util/child_process.h"
#include "common/util/status_macros.h"

namespace stagecoach::runtime {
namespace {

constexpr char kTokenizerTool[] = "stagecoach-sentencepiece";
constexpr int kToolBadTokenizer = 3;  // client/tokens/sentencepiece_tokens.h

// The space-separated ids of `text`; false for a word that is not an id.
bool ParseToolIds(absl::string_view text, std::vector<int64_t>* ids) {
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    int64_t id;
    if (!absl::SimpleAtoi(word, &id)) return false;
    ids->push_back(id);
  }
  return true;
}

// What the tool printed: its tokenizer line, then a line per record.
struct ToolRecords {
  int64_t vocab = 0, bos = -1, eos = -1;
  struct Record {
    int64_t line = 0;
    std::vector<int64_t> prompt, response;
  };
  std::vector<Record> records;
};

absl::StatusOr<ToolRecords> ParseToolOutput(const std::string& out) {
  ToolRecords parsed;
  std::vector<absl::string_view> lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  auto garbled = [](absl::string_view line) {
    return absl::InternalError(
        absl::StrCat(kTokenizerTool, " records printed '", line.substr(0, 80), "'"));
  };
  std::vector<absl::string_view> head =
      lines.empty() ? std::vector<absl::string_view>{} : absl::StrSplit(lines[0], ' ');
  if (head.size() != 4 || head[0] != "tokenizer" || !absl::SimpleAtoi(head[1], &parsed.vocab) ||
      !absl::SimpleAtoi(head[2], &parsed.bos) || !absl::SimpleAtoi(head[3], &parsed.eos)) {
    return garbled(lines.empty() ? "" : lines[0]);
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    std::vector<absl::string_view> fields = absl::StrSplit(lines[i], '\t');
    ToolRecords::Record record;
    if (fields.size() != 3 || !absl::SimpleAtoi(fields[0], &record.line) ||
        !ParseToolIds(fields[1], &record.prompt) || !ParseToolIds(fields[2], &record.response)) {
      return garbled(lines[i]);
    }
    parsed.records.push_back(std::move(record));
  }
  return parsed;
}

// Runs the tool on data.path: INVALID_ARGUMENT naming data.path or data.tokenizer for what the
// tool refuses.
absl::StatusOr<ToolRecords> TokenizeRecords(const spec::DataSpec& data) {
  std::error_code ec;
  const uintmax_t bytes = std::filesystem::file_size(data.path, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.path: cannot read '", data.path, "': ", ec.message()));
  }
  // A minute, and a second more per megabyte of records (the tool encodes several MB/s).
  const absl::Duration timeout = absl::Seconds(60 + static_cast<int64_t>(bytes >> 20));
  const std::string tool = HelperProgramPath(kTokenizerTool, "STAGECOACH_SENTENCEPIECE_TOOL");
  ASSIGN_OR_RETURN(
      ChildOutput run,
      RunChildProcess(tool,
                      {"records", data.path, "--tokenizer", data.tokenizer, "--prompt-field",
                       data.prompt_field, "--response-field", data.response_field},
                      timeout));
  const absl::string_view said =
      absl::StripTrailingAsciiWhitespace(absl::StripPrefix(run.err, "stagectl tokens records: "));
  if (run.exit_code == kToolBadTokenizer) {
    return absl::InvalidArgumentError(absl::StrCat("data.tokenizer: ", said));
  }
  if (run.exit_code == 1) return absl::InvalidArgumentError(absl::StrCat("data.path: ", said));
  if (run.exit_code != 0) {
    return absl::InternalError(absl::StrCat(tool, " records exited ", run.exit_code, ": ", said,
                                            " (set STAGECOACH_SENTENCEPIECE_TOOL to the tool's "
                                            "path, or install it beside stagecoach-worker)"));
  }
  return ParseToolOutput(run.out);
}

}  // namespace

absl::StatusOr<JsonlRecords> ReadJsonlRecords(const spec::JobSpec& spec, int64_t seq,
                                              int64_t vocab) {
  const spec::DataSpec& data = spec.data;
  ASSIGN_OR_RETURN(const ToolRecords tokenized, TokenizeRecords(data));
  if (tokenized.eos < 0) {
    return absl::InvalidArgumentError(absl::StrCat("data.tokenizer: '", data.tokenizer,
                                                   "' has no EOS piece to end each record with"));
  }
  if (vocab > 0 && tokenized.vocab > vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.tokenizer: '", data.tokenizer, "' has ", tokenized.vocab,
                     " pieces, more than the model's vocabulary of ", vocab));
  }
  JsonlRecords out;
  out.eos = tokenized.eos;
  for (const ToolRecords::Record& record : tokenized.records) {
    ++out.read;
    std::vector<int64_t> p = record.prompt;
    if (tokenized.bos >= 0) p.insert(p.begin(), tokenized.bos);
    std::vector<int64_t> r = record.response;
    r.push_back(tokenized.eos);
    const int64_t positions = static_cast<int64_t>(p.size() + r.size()) - 1;
    if (positions > seq) {
      if (data.overlong == "fail") {
        return absl::InvalidArgumentError(absl::StrCat(
            "data.path: '", data.path, "' line ", record.line, ": the record has ", positions,
            " positions, more than the window of ", seq, " (data.overlong: fail)"));
      }
      if (data.overlong == "skip") {
        ++out.skipped;
        continue;
      }
      ++out.truncated;  // document_rows.h cuts it to the window
    }
    const int64_t begin = static_cast<int64_t>(out.tokens.size());
    out.tokens.insert(out.tokens.end(), p.begin(), p.end());
    out.counted.insert(out.counted.end(), p.size(), 0);
    out.tokens.insert(out.tokens.end(), r.begin(), r.end());
    out.counted.insert(out.counted.end(), r.size(), 1);
    out.records.push_back({begin, static_cast<int64_t>(out.tokens.size())});
  }
  if (out.records.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.path: '", data.path, "' holds no record to train on (", out.read,
                     " read, ", out.skipped, " skipped as longer than the window of ", seq, ")"));
  }
  return out;
}

std::unique_ptr<BatchSource> OpenJsonlSource(const spec::JobSpec& spec, JsonlRecords records,
                                             bool want_inputs, bool want_targets) {
  const int64_t eos = records.eos;
  const BatchSource::Records counts{records.read, records.truncated, records.skipped};
  return MakeDocumentSource(spec, std::move(records.tokens), std::move(records.records),
                            std::move(records.counted), eos, want_inputs, want_targets, counts);
}

}  // namespace stagecoach::runtime
