// A daemon's flags, each declared once: its name, type, default, help text and validation. The
// one declaration serves the command line (--help, usage errors), the --config YAML file (a flat
// mapping whose keys are the long flag names, written with '-' or '_'), and the typed value the
// daemon reads after Parse.
//
// Precedence: the command line wins over the config file, the config file over the environment
// (DefaultFromEnv), the environment over the default. The default is the destination's value
// when the flag is declared, so an options struct's documented defaults are the flags' defaults.
//
// Not thread-safe: declare and Parse in main, before other threads start. Destinations must
// outlive Parse.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/rpc/address.h"

namespace stagecoach::daemon {

class FlagSet {
 public:
  // Settings of one declared flag beyond its type.
  class Flag {
   public:
    // Only on the command line, not a config-file key (--check-config).
    Flag& CommandLineOnly();
    // When `variable` is set in the environment, its value replaces the default.
    Flag& DefaultFromEnv(const std::string& variable);
    // Parse fails with "--NAME: required" (and "(or set VARIABLE)" with DefaultFromEnv) when
    // the flag ends up empty.
    Flag& Required();

   private:
    friend class FlagSet;
    struct State;
    explicit Flag(State* state) : state_(state) {}
    State* state_;
  };

  // `description` is the first line of --help.
  explicit FlagSet(std::string description);
  ~FlagSet();
  FlagSet(const FlagSet&) = delete;
  FlagSet& operator=(const FlagSet&) = delete;

  // Declarations, `name` without "--". Each value error names the flag ("--lease: ...") and,
  // when the value came from the config file, the file.
  // Any text.
  Flag& AddString(const std::string& name, std::string* into, const std::string& help);
  // A positive duration with its unit: 500ms, 10s, 1m, 168h.
  Flag& AddDuration(const std::string& name, absl::Duration* into, const std::string& help);
  // An integer >= `min`; `unit` is what it counts ("bytes", "jobs"), for the error message.
  Flag& AddInt(const std::string& name, int64_t* into, int64_t min, const std::string& unit,
               const std::string& help);
  Flag& AddInt(const std::string& name, int* into, int64_t min, const std::string& unit,
               const std::string& help);
  // A finite number >= `min` (e.g. a ratio: 1.25).
  Flag& AddDouble(const std::string& name, double* into, double min, const std::string& help);
  // A switch: present on the command line, or true/false (yes/no, on/off, 1/0) in the file.
  Flag& AddBool(const std::string& name, bool* into, const std::string& help);
  // HOST:PORT (rpc::ParseHostPort); port 0 asks for a free port.
  Flag& AddHostPort(const std::string& name, rpc::HostPort* into, const std::string& help);
  // HOST:PORT or empty (nullopt).
  Flag& AddHostPort(const std::string& name, std::optional<rpc::HostPort>* into,
                    const std::string& help);
  // The path of a file holding a bearer token; `into` receives the token
  // (rpc::ReadTokenFile), empty when no file is named.
  Flag& AddTokenFile(const std::string& name, std::string* into, const std::string& help);

  enum class Outcome {
    kRun,        // every flag parsed and stored in its destination
    kHelpShown,  // --help was asked for and printed to stdout; exit 0
  };
  // Parses `argv` (argv[0] is the program), then the --config file it names, then converts
  // every flag into its destination in declaration order (the first error wins).
  // INVALID_ARGUMENT for an unknown or malformed command-line flag (CLI11's message), a value
  // that is not of the flag's type or a required flag left empty (naming the flag), a config
  // key that is no flag, a non-scalar value or invalid YAML (naming the file and the key);
  // NOT_FOUND for a config file that cannot be read.
  absl::StatusOr<Outcome> Parse(int argc, const char* const* argv);

 private:
  using State = Flag::State;
  State& Declare(const std::string& name, const std::string& help, std::string default_text,
                 std::function<absl::Status(const std::string&)> convert);
  absl::Status ApplyConfigFile(const std::string& path);

  const std::string description_;
  std::string config_path_;
  std::vector<std::unique_ptr<State>> flags_;
};

}  // namespace stagecoach::daemon
