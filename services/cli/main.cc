// The `kvtier` command: one binary, one subcommand per job.
#include <iostream>
#include <string>
#include <vector>

#include "services/base/version.h"
#include "services/cli/commands.h"
#include "services/rpc/library_logs.h"

namespace {

constexpr char kUsage[] =
    "usage: kvtier COMMAND [flags]   (kvtier COMMAND --help for its flags)\n"
    "\n"
    "commands:\n"
    "  quant-eval   compare the latent codecs and the seeds' quantization baselines\n"
    "               on a file of latents or on synthetic ones (--synthetic)\n"
    "  stats        a cache server's capacity, use and counters per tier\n"
    "  make-model   write a random, seeded checkpoint as its authors publish it:\n"
    "               DeepSeek-V2, the V3 family, V3.2 or V4 at small dims (--preset)\n"
    "  run          generate in process on a checkpoint (no servers); ids or --prompt text\n"
    "  generate     generate through a prefill node (kvtier-prefill)\n"
    "  up           start cache + decode + prefill locally on the small trained model\n"
    "               (models/, or PREFIX/share/kvtier installed), run a two-turn\n"
    "               conversation, print its text and the cache's stats\n"
    "  make-certs   a CA and the certificates of the three services and of end clients\n";

}  // namespace

int main(int argc, char** argv) {
  kvtier::RouteLibraryLogs();
  if (argc < 2) {
    std::cerr << kUsage;
    return 2;
  }
  const std::string command = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "--version") {
    std::cout << kvtier::VersionOf("kvtier") << "\n";
    return 0;
  }
  if (command == "--help" || command == "-h" || command == "help") {
    std::cout << kUsage;
    return 0;
  }
  if (command == "quant-eval") return kvtier::cli::RunQuantEval(args);
  if (command == "stats") return kvtier::cli::RunStats(args);
  if (command == "make-model") return kvtier::cli::RunMakeModel(args);
  if (command == "run") return kvtier::cli::RunRun(args);
  if (command == "generate") return kvtier::cli::RunGenerate(args);
  if (command == "up") return kvtier::cli::RunUp(args);
  if (command == "make-certs") return kvtier::cli::RunMakeCerts(args);
  std::cerr << "kvtier: unknown command '" << command << "'\n\n" << kUsage;
  return 2;
}
