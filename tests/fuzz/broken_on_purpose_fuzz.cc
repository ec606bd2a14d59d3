// A target whose property breaks on inputs that start with "break" and that
// crashes on inputs that start with "crash": for the replay driver's own
// test (replay_saves_failing_input_test.sh), never fuzzed.
#include <cstring>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_target.h"

namespace {

bool StartsWith(const uint8_t* data, size_t size, const char* prefix) {
  return size >= std::strlen(prefix) && std::memcmp(data, prefix, std::strlen(prefix)) == 0;
}

volatile int* nowhere = nullptr;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  KVTIER_FUZZ_CHECK(!StartsWith(data, size, "break"));
  if (StartsWith(data, size, "crash")) *nowhere = 1;
  return 0;
}

std::vector<std::string> kvtier::fuzz::Seeds() { return {"fine"}; }
