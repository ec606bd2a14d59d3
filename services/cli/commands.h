// Subcommands of the `kvtier` binary. Each takes the arguments after its name
// and returns the process exit code (0 ok, 1 failure, 2 usage error).
#ifndef KVTIER_SERVICES_CLI_COMMANDS_H_
#define KVTIER_SERVICES_CLI_COMMANDS_H_

#include <string>
#include <vector>

namespace kvtier::cli {

int RunQuantEval(const std::vector<std::string>& args);
int RunStats(const std::vector<std::string>& args);
int RunMakeModel(const std::vector<std::string>& args);
int RunRun(const std::vector<std::string>& args);
int RunGenerate(const std::vector<std::string>& args);
int RunUp(const std::vector<std::string>& args);
int RunMakeCerts(const std::vector<std::string>& args);

}  // namespace kvtier::cli

#endif  // KVTIER_SERVICES_CLI_COMMANDS_H_
