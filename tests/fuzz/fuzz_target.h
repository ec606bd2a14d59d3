// What every fuzz target in tests/fuzz defines: LLVMFuzzerTestOneInput, as
// libFuzzer calls it (scripts/fuzz.sh) and as replay_main.cc calls it in
// every other build (ctest), and Seeds(), valid inputs made with kvtier's
// own encoders for both to start from. A target checks properties that
// must hold for any input with KVTIER_FUZZ_CHECK, which aborts: a crash to
// libFuzzer and a failure to ctest.
#ifndef KVTIER_TESTS_FUZZ_FUZZ_TARGET_H_
#define KVTIER_TESTS_FUZZ_FUZZ_TARGET_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace kvtier::fuzz {

std::vector<std::string> Seeds();

[[noreturn]] inline void PropertyBroken(const char* what, const char* file, int line) {
  std::fprintf(stderr, "%s:%d: property broken: %s\n", file, line, what);
  std::abort();
}

}  // namespace kvtier::fuzz

#define KVTIER_FUZZ_CHECK(condition) \
  ((condition) ? (void)0 : ::kvtier::fuzz::PropertyBroken(#condition, __FILE__, __LINE__))

#endif  // KVTIER_TESTS_FUZZ_FUZZ_TARGET_H_
