// Fresh random inputs for tests: a new seed every run, printed on failure so
// a failing run can be replayed with KVTIER_TEST_SEED=<seed>.
#ifndef KVTIER_TESTS_TEST_RANDOM_H_
#define KVTIER_TESTS_TEST_RANDOM_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

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
  // n token ids drawn uniformly below `vocab`.
  std::vector<uint32_t> Tokens(size_t n, int64_t vocab) {
    std::uniform_int_distribution<uint32_t> id(0, static_cast<uint32_t>(vocab - 1));
    std::vector<uint32_t> tokens(n);
    for (uint32_t& t : tokens) t = id(engine_);
    return tokens;
  }

 private:
  uint64_t seed_;
  std::mt19937_64 engine_;
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TEST_RANDOM_H_
