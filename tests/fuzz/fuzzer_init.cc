// libFuzzer's start in scripts/fuzz.sh's builds: protobuf's complaints
// about the malformed messages a campaign makes silenced, and with
// KVTIER_FUZZ_WRITE_SEEDS=DIR the target's seeds written into DIR, one
// file each, and an exit, so that a campaign starts from inputs that reach
// past the first checks.
#include <google/protobuf/stubs/logging.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  const char* dir = std::getenv("KVTIER_FUZZ_WRITE_SEEDS");
  if (dir == nullptr) return 0;
  std::filesystem::create_directories(dir);
  const std::vector<std::string> seeds = kvtier::fuzz::Seeds();
  for (size_t i = 0; i < seeds.size(); ++i) {
    std::ofstream(std::filesystem::path(dir) / ("seed-" + std::to_string(i)), std::ios::binary) << seeds[i];
  }
  std::exit(0);
}
