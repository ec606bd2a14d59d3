// A small command-line flag parser shared by every kvtier binary: each
// subcommand declares its flags with their help, so `--help` is generated
// and unknown or malformed flags are rejected with a message.
// Accepts `--name value`, `--name=value`, and `--name` alone for booleans.
// Not thread-safe; use from main.
#ifndef KVTIER_SERVICES_BASE_FLAGS_H_
#define KVTIER_SERVICES_BASE_FLAGS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"

namespace kvtier {

class FlagParser {
 public:
  // `usage` is the first line of --help, e.g. "kvtier quant-eval [flags]".
  explicit FlagParser(std::string usage, std::string description = "");

  // The target holds the default and receives the parsed value.
  void AddString(const std::string& name, std::string* target, std::string help);
  void AddUint(const std::string& name, uint64_t* target, std::string help);
  void AddBool(const std::string& name, bool* target, std::string help);

  // Parses args (without the program and subcommand names). INVALID_ARGUMENT
  // for unknown flags, missing values, bad numbers or stray arguments.
  absl::Status Parse(const std::vector<std::string>& args);

  // Parse, for a program's main: the exit code to return now (2 after
  // printing "program: error" to stderr; 0 after printing --help or
  // --version), or nullopt to go on.
  std::optional<int> ParseOrExit(const std::vector<std::string>& args, const std::string& program);
  std::string Help() const;

 private:
  struct Flag {
    std::variant<std::string*, uint64_t*, bool*> target;
    std::string help;
    // The target's value as the first Parse found it, for --help: after
    // it the target holds what was given.
    std::optional<std::string> default_value;
  };
  absl::Status Assign(const std::string& name, Flag& flag, const std::string& value);
  static std::string ValueOf(const Flag& flag);

  std::string usage_;
  std::string description_;
  std::map<std::string, Flag> flags_;
  std::vector<std::string> order_;
  bool help_requested_ = false;
  bool version_requested_ = false;
};

}  // namespace kvtier

#endif  // KVTIER_SERVICES_BASE_FLAGS_H_
