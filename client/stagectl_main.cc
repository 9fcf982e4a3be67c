// stagectl: the command-line client. See DESIGN.md "Command-line contract".
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>

#include "absl/strings/ascii.h"
#include "absl/time/time.h"
#include "client/commands.h"
#include "client/generate_command.h"
#include "client/schedule_command.h"
#include "client/tokens/tokens_command.h"
#include "common/rpc/address.h"
#include "common/rpc/auth.h"
#include "common/rpc/tls.h"

namespace sc = stagecoach;

namespace {

// What the first commands look like, for `stagectl --help`.
constexpr char kExamples[] =
    "Examples (the coordinator from --coordinator or $STAGECOACH_COORDINATOR):\n"
    "  stagectl workers                              the workers and what they run\n"
    "  stagectl inspect --upload model.pt            a model's layers and split points\n"
    "  stagectl plan configs/mlp-4stage-1f1b.yaml    rank the plans the spec leaves open\n"
    "  stagectl plan --job JOB                       a job's ranks: predicted vs measured\n"
    "  stagectl submit configs/mlp-4stage-1f1b.yaml  submit; prints the job id\n"
    "  stagectl watch JOB                            live progress until the job ends\n"
    "  stagectl status JOB                           state, losses, plan, memory per rank\n"
    "  stagectl submit --wait SPEC                   submit and wait: exit 0 on success\n"
    "  stagectl generate JOB --prompt TEXT --vocab vocab.json   text from a trained decoder job\n"
    "Each command's own --help lists its options.\n";

// `stagectl tokens`: its options into `tok`.
CLI::App* AddTokensCommand(CLI::App& app, sc::client::TokensCommandOptions& tok) {
  CLI::App* tokens = app.add_subcommand(
      "tokens",
      "text to the tokens a built-in decoder trains on, and back, with a character vocabulary or a "
      "SentencePiece tokenizer "
      "(works without a cluster)");
  tokens
      ->add_option("action", tok.action,
                   "train (a SentencePiece model of text files), build (the tokens of text "
                   "files, with a new character vocabulary or a --tokenizer), encode (text with "
                   "an existing vocabulary or tokenizer) or decode (tokens to text)")
      ->required();
  tokens->add_option("files", tok.inputs,
                     "text files (build, encode; read in order) or a token file (decode)");
  tokens->add_option("--text", tok.text, "encode this text instead of files");
  tokens->add_option("--vocab", tok.vocab_path,
                     "a character vocabulary (JSON): written by build, read by encode and decode");
  tokens->add_option("--tokenizer", tok.tokenizer_path,
                     "a SentencePiece model (tokenizer.model) instead of --vocab: read by build, "
                     "encode and decode");
  tokens->add_option("--vocab-size", tok.vocab_size,
                     "train: the pieces of the SentencePiece model to train (written to --out)");
  tokens->add_flag("--bos", tok.bos, "encode with --tokenizer: begin with the BOS id");
  tokens->add_flag("--eos", tok.eos, "encode with --tokenizer: end with the EOS id");
  tokens->add_option("--dtype", tok.dtype,
                     "with --tokenizer: token files of uint16 (default) or uint32 ids (data.dtype; "
                     "vocabularies over 65,536)");
  tokens->add_option("--out", tok.out_path,
                     "write the tokens (build, encode) or the text (decode) here; build needs it "
                     "(default otherwise: stdout, token ids space-separated)");
  tokens->footer(
      "Example:\n  stagectl tokens build /usr/share/games/fortunes/{wisdom,people,science} "
      "--vocab vocab.json --out tokens.bin\n  stagectl tokens decode tokens.bin --vocab "
      "vocab.json | head\n");
  return tokens;
}

// `stagectl generate`: its options into `gen`.
CLI::App* AddGenerateCommand(CLI::App& app, sc::client::GenerateOptions& gen) {
  CLI::App* generate = app.add_subcommand(
      "generate",
      "write text with a trained decoder job (built-in gpt or llama): a paused job's current "
      "weights or a finished job's final checkpoint, decoding through its pipeline with a "
      "key/value cache on every stage; streams the text as it comes");
  generate->add_option("JOB", gen.job_id, "job id")->required();
  generate->add_option("--prompt", gen.prompts,
                       "the text to continue; repeat it to decode several prompts together");
  generate->add_option("--prompt-ids", gen.prompt_ids,
                       "a prompt as token ids separated by spaces (repeatable); the ids that "
                       "come back are printed too, for a tokenizer of the client's own");
  generate->add_option("--vocab", gen.vocab_path,
                       "the character vocabulary the job's tokens were built with (stagectl "
                       "tokens build)");
  generate->add_option("--tokenizer", gen.tokenizer_path,
                       "a SentencePiece model (default for a model.hf job: its directory's "
                       "tokenizer.model, when there)");
  generate->add_option("--tokens", gen.tokens, "how many tokens to generate (default 200)");
  generate->add_option("--temperature", gen.temperature,
                       "softmax temperature; 0 is greedy decoding (default 0.8)");
  generate->add_option("--top-k", gen.top_k,
                       "draw among the K most likely tokens only (default 0: all)");
  generate->add_option("--seed", gen.seed, "seed of the draws: the same seed, the same text");
  generate->add_option("--timeout", gen.timeout,
                       "give up after this long, a helper job's start included (default 10m)");
  return generate;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"stagectl: submit, watch and steer Stagecoach pipeline jobs"};
  app.require_subcommand(1);
  app.fallthrough();  // global options may stand after the command too

  std::string coordinator = "127.0.0.1:7070";
  if (const char* env = std::getenv("STAGECOACH_COORDINATOR")) coordinator = env;
  std::string format = "table";
  app.add_option("--coordinator", coordinator,
                 "coordinator address HOST:PORT (default: $STAGECOACH_COORDINATOR or "
                 "127.0.0.1:7070)");
  app.add_option("-o,--output", format, "output format: table, json or yaml");
  sc::rpc::TlsFiles tls;
  std::string tls_server_name, token_file;
  app.add_option("--tls-ca", tls.ca,
                 "connect with TLS, verifying the coordinator against this PEM CA (default: "
                 "plaintext; with only --tls-cert, the system's roots)");
  app.add_option("--tls-cert", tls.cert,
                 "PEM client certificate presented to the coordinator (mutual TLS)");
  app.add_option("--tls-key", tls.key, "PEM private key of --tls-cert");
  app.add_option("--tls-server-name", tls_server_name,
                 "name the coordinator's certificate must carry (default: the --coordinator host)");
  app.add_option("--token-file", token_file,
                 "send the token in this file as 'authorization: Bearer' on every call "
                 "(default: $STAGECOACH_TOKEN)");

  std::string spec_path, job_id;
  bool wait = false;
  auto* submit = app.add_subcommand("submit", "submit a job spec; prints the job id");
  submit->add_option("SPEC", spec_path, "job spec (YAML)")->required();
  sc::client::SubmitUploads uploads;
  submit->add_option("--model", uploads.model,
                     "upload this TorchScript file to the coordinator and run it as the spec's "
                     "model.torchscript (workers fetch it from the coordinator)");
  submit->add_option("--data", uploads.data,
                     "upload this (small) dataset file to the coordinator and use it as the "
                     "spec's data.path");
  submit->add_flag("--wait", wait,
                   "wait for the job to end: exit 0 on SUCCEEDED, 1 on FAILED or CANCELLED");
  bool paused = false;
  submit->add_flag("--paused", paused,
                   "start the job paused: placed and started, holding before its first step "
                   "(then: resume, run --steps N, or step)");
  std::string memory_limit;
  int plan_top = 15;
  auto* plan = app.add_subcommand(
      "plan",
      "search plans for a job spec without submitting it: the coordinator profiles the model on "
      "a worker, simulates every schedule x stages per worker x microbatches x split the spec "
      "leaves open (schedule.kind auto, or a named schedule's variants) and ranks them by "
      "predicted step time and memory; with --job, a submitted job's plan per rank: predicted "
      "compute and bubble beside what its latest step measured");
  std::string plan_job;
  auto* plan_spec =
      plan->add_option("SPEC", spec_path, "job spec (YAML); placement.workers is required");
  auto* plan_job_option = plan->add_option(
      "--job", plan_job,
      "a submitted job: its split, and per rank the predicted compute and bubble beside the "
      "measured ones of its latest traced step and the bubble the schedule gives those costs");
  plan_spec->excludes(plan_job_option);
  plan_job_option->excludes(plan_spec);
  plan->add_option("--memory-limit", memory_limit,
                   "most bytes a worker may hold, e.g. 8GiB (default: the spec's "
                   "placement.memory_limit, or none)");
  plan->add_option("--top", plan_top, "table rows to print (default 15; -o json prints all)");
  plan->add_option("--model", uploads.model, "as for submit");
  plan->add_option("--data", uploads.data, "as for submit");
  std::string inspect_model;
  std::string inspect_device;
  bool inspect_upload = false;
  auto* inspect = app.add_subcommand(
      "inspect",
      "list a TorchScript model's layers and the split points it offers, nested modules "
      "included, with their parameter counts: a worker loads the model; nothing is submitted");
  inspect
      ->add_option("MODEL", inspect_model,
                   "the model as model.torchscript names it: a path on the workers, or "
                   "artifact:<sha256>; with --upload, a local file")
      ->required();
  inspect->add_flag("--upload", inspect_upload, "upload the local file MODEL first");
  inspect->add_option("--device", inspect_device,
                      "load it on a worker of this device: cpu or cuda (default: any)");
  auto* list = app.add_subcommand("list", "list jobs");
  auto* status = app.add_subcommand("status", "show a job");
  status->add_option("JOB", job_id, "job id")->required();
  bool status_history = false;
  int64_t history_from = 0;
  int history_steps = 0;
  status->add_flag("--history", status_history,
                   "every step's loss and every state change (default: the latest 100 of each)");
  status
      ->add_option("--history-from", history_from,
                   "with --history-steps: the first job step of the page of history shown")
      ->check(CLI::NonNegativeNumber);
  status
      ->add_option("--history-steps", history_steps,
                   "show this many steps of history from --history-from (a page)")
      ->check(CLI::NonNegativeNumber);
  auto* watch = app.add_subcommand(
      "watch",
      "follow a job until it ends: live progress on a terminal, a line (-o json: a JSON object) "
      "per event otherwise; exit 0 on SUCCEEDED, 1 otherwise");
  watch->add_option("JOB", job_id, "job id")->required();
  auto* cancel = app.add_subcommand("cancel", "cancel a job");
  cancel->add_option("JOB", job_id, "job id")->required();
  auto* checkpoint = app.add_subcommand(
      "checkpoint",
      "ask a running job to write a checkpoint now; prints the step it is taken after and its "
      "directory");
  checkpoint->add_option("JOB", job_id, "job id")->required();
  auto* workers = app.add_subcommand("workers", "list workers");
  auto* pause = app.add_subcommand(
      "pause", "pause a running job after the current step; prints the global step it holds at");
  pause->add_option("JOB", job_id, "job id")->required();
  auto* resume = app.add_subcommand("resume", "resume a paused job through to its last step");
  resume->add_option("JOB", job_id, "job id")->required();
  int64_t run_steps = 0;
  auto* run = app.add_subcommand(
      "run", "run N more steps, then hold (paused); prints the global step it runs until");
  run->add_option("JOB", job_id, "job id")->required();
  run->add_option("--steps", run_steps, "how many more steps (>= 1)")->required();
  sc::client::StepOptions step_options;
  auto* step = app.add_subcommand(
      "step",
      "run one step of a paused job on a client batch (.npy): prints the global step and loss, "
      "or with --forward-only returns the outputs");
  step->add_option("JOB", job_id, "job id")->required();
  step->add_option("--inputs,--input", step_options.inputs,
                   "stage 0's batch: a NumPy .npy file, rows first (at least as many rows as "
                   "the job's microbatches); or ragged rows of token ids: a .jsonl file (a "
                   "line per row: an array of ids, or {\"inputs\": [...], \"targets\": "
                   "[...]}), an .npy object array of rows, or a comma-separated list of .npy "
                   "files (1-D arrays, one per row, or object arrays)")
      ->required();
  step->add_option("--targets", step_options.targets,
                   "the loss targets: an .npy file, one row per input row, or for a list of "
                   ".npy rows a list of as many (required unless --forward-only or a .jsonl "
                   "--inputs)");
  step->add_flag("--forward-only", step_options.forward_only,
                 "inference on the job's current weights instead of a training step");
  step->add_option("--save-outputs", step_options.save_outputs,
                   "with --forward-only: write the outputs to this .npy file (default: print a "
                   "summary, or the values with -o json|yaml)");
  step->add_option("--timeout", step_options.timeout,
                   "how long to wait for the step, e.g. 30s, 5m (default 5m)");
  int64_t trace_step = -1;
  std::string trace_out;
  auto* trace = app.add_subcommand(
      "trace",
      "write the measured Chrome trace (Perfetto) of a completed step to a file; prints the step "
      "and the steps still kept");
  trace->add_option("JOB", job_id, "job id")->required();
  trace->add_option("--step", trace_step, "global step to trace (default -1: the latest)");
  trace->add_option("--out", trace_out, "the trace JSON file to write")->required();
  int diagnose_timeline = 8;
  auto* diagnose = app.add_subcommand(
      "diagnose",
      "what each rank of a job is doing now (its action, the peer and tag it waits on) with its "
      "recent actions, and the job's stall and stragglers");
  diagnose->add_option("JOB", job_id, "job id")->required();
  diagnose
      ->add_option("--timeline", diagnose_timeline,
                   "recent actions shown per rank (at most 32; default 8)")
      ->check(CLI::Range(0, 32));
  std::string infer_input, infer_out, infer_timeout = "5m";
  auto* infer = app.add_subcommand(
      "infer", "run the spec's model forward-only on a batch (.npy) and return the outputs");
  infer->add_option("SPEC", spec_path, "job spec (YAML); its schedule runs as ForwardOnly")
      ->required();
  infer->add_option("--input,--inputs", infer_input, "the batch: a NumPy .npy file, rows first")
      ->required();
  // Not --output: that is the global output format, which may stand after the command.
  infer->add_option("--out", infer_out,
                    "write the outputs to this .npy file (default: print a summary, or the "
                    "values with -o json|yaml)");
  infer->add_option("--timeout", infer_timeout,
                    "give up (and cancel the job) after this long, queueing included, e.g. 30s, "
                    "5m (default 5m)");

  sc::client::ScheduleCommandOptions sched;
  auto* schedule = app.add_subcommand(
      "schedule",
      "generate, lower, validate and simulate a pipeline schedule, or check a schedule CSV "
      "(works without a cluster)");
  auto* kind_opt = schedule->add_option(
      "--kind", sched.kind,
      "schedule to generate: GPipe, 1F1B, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, "
      "ZBVZeroBubble, DualPipeV, VHalf, VMin or ForwardOnly (any case)");
  auto* csv_opt = schedule->add_option("--csv", sched.csv_path,
                                       "read this schedule CSV instead (PyTorch's "
                                       "_dump_csv layout: one row per rank)");
  kind_opt->excludes(csv_opt);
  schedule->add_option("--ranks", sched.ranks, "pipeline ranks (with --kind)");
  schedule->add_option("--microbatches", sched.microbatches,
                       "microbatches per step (with --kind; with --csv, overrides the count "
                       "read from the file)");
  schedule->add_option("--stages-per-rank", sched.stages_per_rank,
                       "stages per rank (default 2 for the multi-stage schedules, else 1)");
  schedule->add_flag("--time-aligned", sched.time_aligned,
                     "GPipe/1F1B: keep idle slots and leave out REDUCE_GRAD (PyTorch's raw list)");
  schedule->add_option("--format", sched.format,
                       "with --kind: output grid|csv|json|chrome (default grid); with --csv: the "
                       "file's format compute_only|compute_comms (default compute_only)");
  schedule->add_option("--emit", sched.emit,
                       "with --csv: output grid|csv|json|chrome (default grid)");
  schedule->add_flag("--lowered", sched.lowered,
                     "show the lowered list (SEND/RECV, UNSHARD/RESHARD, REDUCE_GRAD)");
  schedule->add_option("--max-active-stages", sched.max_active_stages,
                       "lowering: stages kept unsharded at once (default 3, PyTorch's); 0 leaves "
                       "UNSHARD/RESHARD out");
  schedule->add_option("--unshard", sched.unshard,
                       "lower as a job with placement.shard: parameters and this "
                       "placement.unshard (step|stage) does, checking that every compute action "
                       "runs on gathered parameters (replaces --max-active-stages)");
  schedule->add_flag("--validate", sched.validate,
                     "with --csv: only check the file and print a one-line verdict");
  schedule->add_flag("--simulate", sched.simulate,
                     "simulate the lowered list under the cost model and report makespan, "
                     "bubbles and peak activations");
  schedule->add_option("--costs", sched.costs,
                       "simulated durations F,B,I,W of every stage (default 1,2,1,1)");
  schedule->add_option("--latency", sched.latency, "simulated latency of every message");
  schedule->add_option("--bandwidth", sched.bandwidth,
                       "simulated bytes per time unit of every link (default 0: infinite)");
  schedule->add_option("--message-bytes", sched.message_bytes,
                       "simulated size of every activation and gradient message");
  schedule->add_option("--activation-bytes", sched.activation_bytes,
                       "simulated memory: bytes a stage's forward keeps per microbatch until "
                       "its backward (adds each rank's predicted peak)");
  schedule->add_option("--weight-activation-bytes", sched.weight_activation_bytes,
                       "simulated memory: the part of --activation-bytes that W still needs "
                       "after I (split backward)");
  schedule->add_option("--static-bytes", sched.static_bytes,
                       "simulated memory: a stage's parameters, gradients and optimizer state");
  schedule->add_option("--out", sched.out_path, "write the output to this file");
  std::string schedule_job;
  auto* job_opt = schedule->add_option(
      "--job", schedule_job,
      "show this job's schedule as the coordinator planned it (the grid, the lowered grid with "
      "--lowered; -o json|yaml: every rank's action lists)");
  job_opt->excludes(kind_opt)->excludes(csv_opt);

  sc::client::TokensCommandOptions tok;
  CLI::App* tokens = AddTokensCommand(app, tok);
  sc::client::GenerateOptions gen;
  CLI::App* generate = AddGenerateCommand(app, gen);
  app.footer(kExamples);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (tokens->parsed() && sc::client::UsesSentencePiece(tok)) {
    return sc::client::ExecSentencePiece(tok, std::cerr);
  }
  if (tokens->parsed()) return sc::client::RunTokens(tok, std::cout, std::cerr);
  if (schedule->parsed() && schedule_job.empty()) {
    return sc::client::RunSchedule(sched, std::cout, std::cerr);
  }
  if (schedule->parsed()) {
    // With --job only --lowered and --out apply: the rest describe an offline schedule.
    for (const CLI::Option* opt : schedule->get_options()) {
      const std::string name = opt->get_name();
      if (opt->count() > 0 && opt != job_opt && name != "--lowered" && name != "--out") {
        std::cerr << "stagectl: schedule: --job: cannot be combined with " << name
                  << " (only --lowered, --out and -o apply to a job's schedule)\n";
        return 2;
      }
    }
  }
  auto parsed_format = sc::client::ParseOutputFormat(format);
  if (!parsed_format.ok()) {
    std::cerr << "stagectl: " << parsed_format.status().message() << "\n";
    return 2;
  }
  if (auto addr = sc::rpc::ParseHostPort(coordinator, "--coordinator"); !addr.ok()) {
    std::cerr << "stagectl: " << addr.status().message() << "\n";
    return 2;
  }
  sc::client::ClientOptions options;
  options.coordinator = coordinator;
  options.format = *parsed_format;
  auto credentials = sc::rpc::MakeChannelCredentials(tls);
  if (!credentials.ok()) {
    std::cerr << "stagectl: " << credentials.status().message() << "\n";
    return 2;
  }
  options.security.credentials = *credentials;
  options.security.server_name = tls_server_name;
  if (!token_file.empty()) {
    auto token = sc::rpc::ReadTokenFile(token_file, "--token-file");
    if (!token.ok()) {
      std::cerr << "stagectl: " << token.status().message() << "\n";
      return 2;
    }
    options.security.bearer_token = *token;
  } else if (const char* env = std::getenv("STAGECOACH_TOKEN"); env != nullptr && *env != '\0') {
    std::string token(absl::StripAsciiWhitespace(env));
    if (auto s = sc::rpc::ValidateToken(token, "$STAGECOACH_TOKEN"); !s.ok()) {
      std::cerr << "stagectl: " << s.message() << "\n";
      return 2;
    }
    options.security.bearer_token = token;
  }
  if (generate->parsed()) return sc::client::RunGenerate(gen, options, std::cout, std::cerr);
  sc::client::Commands commands(options, std::cout, std::cerr);
  if (submit->parsed()) return commands.Submit(spec_path, wait, uploads, paused);
  if (plan->parsed()) {
    if (!plan_job.empty()) return commands.PlanOfJob(plan_job);
    if (spec_path.empty()) {
      std::cerr << "stagectl: plan: give a SPEC to search plans for, or --job JOB\n";
      return 2;
    }
    return commands.Plan(spec_path, memory_limit, plan_top, uploads);
  }
  if (inspect->parsed()) return commands.Inspect(inspect_model, inspect_upload, inspect_device);
  if (list->parsed()) return commands.List();
  if (status->parsed()) {
    return commands.Status(job_id, {status_history, history_from, history_steps});
  }
  if (watch->parsed()) return commands.Watch(job_id);
  if (cancel->parsed()) return commands.Cancel(job_id);
  if (checkpoint->parsed()) return commands.Checkpoint(job_id);
  if (workers->parsed()) return commands.Workers();
  if (pause->parsed()) return commands.Pause(job_id);
  if (resume->parsed()) return commands.Resume(job_id);
  if (run->parsed()) return commands.RunSteps(job_id, run_steps);
  if (step->parsed()) return commands.Step(job_id, step_options);
  if (trace->parsed()) return commands.Trace(job_id, trace_step, trace_out);
  if (diagnose->parsed()) return commands.Diagnose(job_id, diagnose_timeline);
  if (schedule->parsed()) return commands.JobSchedule(schedule_job, sched.lowered, sched.out_path);
  if (infer->parsed()) {
    absl::Duration timeout;
    if (!absl::ParseDuration(infer_timeout, &timeout) || timeout <= absl::ZeroDuration()) {
      std::cerr << "stagectl: infer: --timeout: must be a positive duration such as 30s or 5m, "
                   "got '"
                << infer_timeout << "'\n";
      return 2;
    }
    return commands.Infer(spec_path, infer_input, infer_out, timeout);
  }
  return 2;
}
