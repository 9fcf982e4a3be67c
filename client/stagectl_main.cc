// stagectl: the command-line client. See DESIGN.md "Command-line contract".
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>

#include "client/commands.h"
#include "common/rpc/address.h"

namespace sc = stagecoach;

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

  std::string spec_path, job_id;
  bool wait = false;
  auto* submit = app.add_subcommand("submit", "submit a job spec; prints the job id");
  submit->add_option("SPEC", spec_path, "job spec (YAML)")->required();
  submit->add_flag("--wait", wait,
                   "wait for the job to end: exit 0 on SUCCEEDED, 1 on FAILED or CANCELLED");
  auto* list = app.add_subcommand("list", "list jobs");
  auto* status = app.add_subcommand("status", "show a job");
  status->add_option("JOB", job_id, "job id")->required();
  auto* watch = app.add_subcommand("watch", "follow a job's progress until it ends");
  watch->add_option("JOB", job_id, "job id")->required();
  auto* cancel = app.add_subcommand("cancel", "cancel a job");
  cancel->add_option("JOB", job_id, "job id")->required();
  auto* workers = app.add_subcommand("workers", "list workers");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
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
  sc::client::Commands commands(options, std::cout, std::cerr);
  if (submit->parsed()) return commands.Submit(spec_path, wait);
  if (list->parsed()) return commands.List();
  if (status->parsed()) return commands.Status(job_id);
  if (watch->parsed()) return commands.Watch(job_id);
  if (cancel->parsed()) return commands.Cancel(job_id);
  if (workers->parsed()) return commands.Workers();
  return 2;
}
