// What a test can see of memory: whether bytes are all zero, whether
// pages are already in memory (made ahead) rather than to be faulted in.
#ifndef KVTIER_TESTS_CACHE_STORE_MEMORY_CHECKS_H_
#define KVTIER_TESTS_CACHE_STORE_MEMORY_CHECKS_H_

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace kvtier::cache {

inline bool AllZero(std::string_view bytes) { return bytes.find_first_not_of('\0') == std::string_view::npos; }
inline bool AllZero(const uint8_t* at, size_t n) { return AllZero({reinterpret_cast<const char*>(at), n}); }

// Every page of [at, at + n) in memory (mincore), `at` page-aligned.
inline bool AllPagesPresent(void* at, size_t n) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in((n + page - 1) / page);
  if (mincore(at, n, in.data()) != 0) return false;
  return std::all_of(in.begin(), in.end(), [](unsigned char c) { return (c & 1) != 0; });
}

}  // namespace kvtier::cache

#endif  // KVTIER_TESTS_CACHE_STORE_MEMORY_CHECKS_H_
