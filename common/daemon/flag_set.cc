// A daemon's flags, declared once (see flag_set.h).
#include "common/daemon/flag_set.h"

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/auth.h"
#include "common/process/config_file.h"

namespace stagecoach::daemon {

struct FlagSet::Flag::State {
  std::string name;  // without "--"
  std::string help;
  std::string default_text;
  std::string text;  // the value: default, environment, file or command line
  bool is_bool = false;
  bool switch_given = false;  // a bool flag present on the command line
  bool config_key = true;
  bool required = false;
  std::string env;        // DefaultFromEnv
  std::string from_file;  // the config file that set `text`, if one did
  CLI::Option* option = nullptr;
  std::function<absl::Status(const std::string&)> convert;  // text -> destination
  Flag handle{nullptr};
};

namespace {

absl::Status ValueError(const std::string& name, const std::string& what, const std::string& text) {
  return absl::InvalidArgumentError(absl::StrCat("--", name, ": ", what, ", got '", text, "'"));
}

absl::StatusOr<bool> ParseBool(absl::string_view text) {
  const std::string t = absl::AsciiStrToLower(text);
  if (t == "true" || t == "yes" || t == "on" || t == "1") return true;
  if (t == "false" || t == "no" || t == "off" || t == "0") return false;
  return absl::InvalidArgumentError("must be true or false");
}

absl::StatusOr<int64_t> ParseInt(const std::string& name, const std::string& text, int64_t min,
                                 int64_t max, const std::string& unit) {
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value) || value < min || value > max) {
    return ValueError(name,
                      min == 1 ? absl::StrCat("must be a positive number of ", unit)
                               : absl::StrCat("must be a number of ", unit, " >= ", min),
                      text);
  }
  return value;
}

// Converts an integer flag's text into `*into`, whose type bounds it from above.
template <typename T>
std::function<absl::Status(const std::string&)> IntoInteger(const std::string& name, T* into,
                                                            int64_t min, const std::string& unit) {
  return [name, into, min, unit](const std::string& text) {
    auto value = ParseInt(name, text, min, std::numeric_limits<T>::max(), unit);
    if (!value.ok()) return value.status();
    *into = static_cast<T>(*value);
    return absl::OkStatus();
  };
}

}  // namespace

FlagSet::Flag& FlagSet::Flag::CommandLineOnly() {
  state_->config_key = false;
  return *this;
}

FlagSet::Flag& FlagSet::Flag::DefaultFromEnv(const std::string& variable) {
  state_->env = variable;
  if (const char* value = std::getenv(variable.c_str())) state_->text = value;
  return *this;
}

FlagSet::Flag& FlagSet::Flag::Required() {
  state_->required = true;
  return *this;
}

FlagSet::FlagSet(std::string description) : description_(std::move(description)) {}

FlagSet::~FlagSet() = default;

FlagSet::State& FlagSet::Declare(const std::string& name, const std::string& help,
                                 std::string default_text,
                                 std::function<absl::Status(const std::string&)> convert) {
  auto state = std::make_unique<State>();
  state->name = name;
  state->help = help;
  state->default_text = default_text;
  state->text = std::move(default_text);
  state->convert = std::move(convert);
  state->handle = Flag(state.get());
  flags_.push_back(std::move(state));
  return *flags_.back();
}

FlagSet::Flag& FlagSet::AddString(const std::string& name, std::string* into,
                                  const std::string& help) {
  return Declare(name, help, *into,
                 [into](const std::string& text) {
                   *into = text;
                   return absl::OkStatus();
                 })
      .handle;
}

FlagSet::Flag& FlagSet::AddDuration(const std::string& name, absl::Duration* into,
                                    const std::string& help) {
  return Declare(name, help, absl::FormatDuration(*into),
                 [name, into](const std::string& text) {
                   absl::Duration d;
                   if (!absl::ParseDuration(text, &d) || d <= absl::ZeroDuration()) {
                     return ValueError(name, "must be a positive duration like 500ms, 10s or 1m",
                                       text);
                   }
                   *into = d;
                   return absl::OkStatus();
                 })
      .handle;
}

FlagSet::Flag& FlagSet::AddInt(const std::string& name, int64_t* into, int64_t min,
                               const std::string& unit, const std::string& help) {
  return Declare(name, help, absl::StrCat(*into), IntoInteger(name, into, min, unit)).handle;
}

FlagSet::Flag& FlagSet::AddInt(const std::string& name, int* into, int64_t min,
                               const std::string& unit, const std::string& help) {
  return Declare(name, help, absl::StrCat(*into), IntoInteger(name, into, min, unit)).handle;
}

FlagSet::Flag& FlagSet::AddDouble(const std::string& name, double* into, double min,
                                  const std::string& help) {
  auto convert = [name, into, min](const std::string& text) {
    double value = 0;
    if (!absl::SimpleAtod(text, &value) || !std::isfinite(value)) {
      return ValueError(name, "must be a number", text);
    }
    if (value < min) return ValueError(name, absl::StrCat("must be at least ", min), text);
    *into = value;
    return absl::OkStatus();
  };
  return Declare(name, help, absl::StrCat(*into), std::move(convert)).handle;
}

FlagSet::Flag& FlagSet::AddBool(const std::string& name, bool* into, const std::string& help) {
  State& state =
      Declare(name, help, *into ? "true" : "false", [name, into](const std::string& text) {
        auto value = ParseBool(text);
        if (!value.ok()) return ValueError(name, "must be true or false", text);
        *into = *value;
        return absl::OkStatus();
      });
  state.is_bool = true;
  return state.handle;
}

FlagSet::Flag& FlagSet::AddHostPort(const std::string& name, rpc::HostPort* into,
                                    const std::string& help) {
  return Declare(name, help, into->host.empty() ? "" : into->ToString(),
                 [name, into](const std::string& text) {
                   auto parsed = rpc::ParseHostPort(text, "--" + name);
                   if (!parsed.ok()) return parsed.status();
                   *into = *parsed;
                   return absl::OkStatus();
                 })
      .handle;
}

FlagSet::Flag& FlagSet::AddHostPort(const std::string& name, std::optional<rpc::HostPort>* into,
                                    const std::string& help) {
  return Declare(name, help, into->has_value() ? (*into)->ToString() : "",
                 [name, into](const std::string& text) {
                   if (text.empty()) {
                     into->reset();
                     return absl::OkStatus();
                   }
                   auto parsed = rpc::ParseHostPort(text, "--" + name);
                   if (!parsed.ok()) return parsed.status();
                   *into = *parsed;
                   return absl::OkStatus();
                 })
      .handle;
}

FlagSet::Flag& FlagSet::AddTokenFile(const std::string& name, std::string* into,
                                     const std::string& help) {
  return Declare(name, help, "",
                 [name, into](const std::string& path) {
                   into->clear();
                   if (path.empty()) return absl::OkStatus();
                   auto token = rpc::ReadTokenFile(path, "--" + name);
                   if (!token.ok()) return token.status();
                   *into = *token;
                   return absl::OkStatus();
                 })
      .handle;
}

absl::Status FlagSet::ApplyConfigFile(const std::string& path) {
  std::set<std::string> allowed;
  for (const auto& flag : flags_) {
    if (flag->config_key) allowed.insert(flag->name);
  }
  auto file = LoadConfigFile(path, allowed);
  if (!file.ok()) return file.status();
  for (const auto& flag : flags_) {
    auto it = file->find(flag->name);
    if (it == file->end()) continue;
    const bool on_command_line = flag->is_bool ? flag->switch_given : flag->option->count() > 0;
    if (on_command_line) continue;
    flag->text = it->second;
    flag->from_file = path;
  }
  return absl::OkStatus();
}

absl::StatusOr<FlagSet::Outcome> FlagSet::Parse(int argc, const char* const* argv) {
  CLI::App app{description_};
  app.add_option("--config", config_path_, "YAML file with any of these options as keys");
  for (const auto& flag : flags_) {
    if (flag->is_bool) {
      flag->option = app.add_flag("--" + flag->name, flag->switch_given, flag->help);
    } else {
      flag->option = app.add_option("--" + flag->name, flag->text, flag->help);
      if (!flag->default_text.empty()) flag->option->default_str(flag->default_text);
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) {
      app.exit(e, std::cout, std::cerr);  // prints the help
      return Outcome::kHelpShown;
    }
    return absl::InvalidArgumentError(absl::StrCat(e.what(), " (run with --help for the options)"));
  }
  for (const auto& flag : flags_) {
    if (flag->is_bool && flag->switch_given) flag->text = "true";
  }
  if (!config_path_.empty()) {
    if (absl::Status applied = ApplyConfigFile(config_path_); !applied.ok()) return applied;
  }
  for (const auto& flag : flags_) {
    if (flag->required && flag->text.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag->name, ": required",
                       flag->env.empty() ? "" : absl::StrCat(" (or set ", flag->env, ")")));
    }
    absl::Status converted = flag->convert(flag->text);
    if (!converted.ok()) {
      if (flag->from_file.empty()) return converted;
      return absl::Status(converted.code(),
                          absl::StrCat(converted.message(), " (in ", flag->from_file, ")"));
    }
  }
  for (const auto& flag : flags_) flag->option = nullptr;
  return Outcome::kRun;
}

}  // namespace stagecoach::daemon
