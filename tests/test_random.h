// Fresh random inputs for tests: a new seed every run, printed on failure so
// a failing run can be replayed with KVTIER_TEST_SEED=<seed>.
#ifndef KVTIER_TESTS_TEST_RANDOM_H_
#define KVTIER_TESTS_TEST_RANDOM_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>

namespace kvtier::testing {

inline uint64_t TestSeed() {
  if (const char* env = std::getenv("KVTIER_TEST_SEED")) return std::strtoull(env, nullptr, 10);
  return (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
}

// Seeds an engine and records the seed in the test's failure output.
class SeededRng {
 public:
  SeededRng() : seed_(TestSeed()), engine_(seed_) {}
  uint64_t seed() const { return seed_; }
  std::mt19937_64& engine() { return engine_; }
  std::string Trace() const { return "KVTIER_TEST_SEED=" + std::to_string(seed_); }

 private:
  uint64_t seed_;
  std::mt19937_64 engine_;
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TEST_RANDOM_H_
