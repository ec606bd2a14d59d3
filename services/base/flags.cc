#include "services/base/flags.h"

#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "services/base/version.h"

namespace kvtier {

FlagParser::FlagParser(std::string usage, std::string description)
    : usage_(std::move(usage)), description_(std::move(description)) {}

void FlagParser::AddString(const std::string& name, std::string* target, std::string help) {
  flags_[name] = Flag{target, std::move(help), std::nullopt};
  order_.push_back(name);
}
void FlagParser::AddUint(const std::string& name, uint64_t* target, std::string help) {
  flags_[name] = Flag{target, std::move(help), std::nullopt};
  order_.push_back(name);
}
void FlagParser::AddBool(const std::string& name, bool* target, std::string help) {
  flags_[name] = Flag{target, std::move(help), std::nullopt};
  order_.push_back(name);
}

absl::Status FlagParser::Assign(const std::string& name, Flag& flag, const std::string& value) {
  if (auto* s = std::get_if<std::string*>(&flag.target)) {
    **s = value;
  } else if (auto* u = std::get_if<uint64_t*>(&flag.target)) {
    if (!absl::SimpleAtoi(value, *u)) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " wants a non-negative integer, got '", value, "'"));
    }
  } else if (auto* b = std::get_if<bool*>(&flag.target)) {
    if (value == "true" || value == "1") {
      **b = true;
    } else if (value == "false" || value == "0") {
      **b = false;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " wants true or false, got '", value, "'"));
    }
  }
  return absl::OkStatus();
}

std::string FlagParser::ValueOf(const Flag& flag) {
  if (auto* s = std::get_if<std::string*>(&flag.target)) return **s;
  if (auto* u = std::get_if<uint64_t*>(&flag.target)) return absl::StrCat(**u);
  return *std::get<bool*>(flag.target) ? "true" : "false";
}

absl::Status FlagParser::Parse(const std::vector<std::string>& args) {
  for (auto& [name, flag] : flags_) {
    if (!flag.default_value.has_value()) flag.default_value = ValueOf(flag);
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      help_requested_ = true;
      continue;
    }
    if (arg == "--version") {
      version_requested_ = true;
      continue;
    }
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    std::string name = arg.substr(2);
    std::string value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
      has_value = true;
    }
    auto it = flags_.find(name);
    if (it == flags_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name, " (see --help)"));
    }
    if (!has_value) {
      if (std::holds_alternative<bool*>(it->second.target)) {
        value = "true";
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      }
    }
    if (absl::Status s = Assign(name, it->second, value); !s.ok()) return s;
  }
  return absl::OkStatus();
}

std::optional<int> FlagParser::ParseOrExit(const std::vector<std::string>& args, const std::string& program) {
  if (absl::Status s = Parse(args); !s.ok()) {
    std::cerr << program << ": " << s.message() << "\n";
    return 2;
  }
  if (help_requested_) {
    std::cout << Help();
    return 0;
  }
  if (version_requested_) {
    // "kvtier run" is the kvtier CLI's: its version is the CLI's.
    std::cout << VersionOf(program.substr(0, program.find(' '))) << "\n";
    return 0;
  }
  return std::nullopt;
}

std::string FlagParser::Help() const {
  std::string out = absl::StrCat("usage: ", usage_, "\n");
  if (!description_.empty()) absl::StrAppend(&out, "\n", description_, "\n");
  absl::StrAppend(&out, "\nflags:\n");
  for (const std::string& name : order_) {
    const Flag& f = flags_.at(name);
    const std::string default_value = f.default_value.value_or(ValueOf(f));
    absl::StrAppend(&out, "  --", name, "\n      ", f.help);
    if (!default_value.empty()) absl::StrAppend(&out, " (default: ", default_value, ")");
    absl::StrAppend(&out, "\n");
  }
  absl::StrAppend(&out, "  --help\n      print this help\n  --version\n      print the version\n");
  return out;
}

}  // namespace kvtier
