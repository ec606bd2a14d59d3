// Where a test finds a program it starts: the build's own, unless the
// environment names another (the device machine runs binaries built here
// from a bundle at another path: scripts/device_bundle.sh).
#ifndef KVTIER_TESTS_BINARY_PATH_H_
#define KVTIER_TESTS_BINARY_PATH_H_

#include <cstdlib>
#include <string>

namespace kvtier::testing {

inline std::string BinaryPath(const char* env_name, const char* built) {
  const char* from_env = std::getenv(env_name);
  return from_env != nullptr && *from_env != '\0' ? from_env : built;
}

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_BINARY_PATH_H_
