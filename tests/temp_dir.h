// A fresh directory under the system's temporary directory for one test,
// unique (mkdtemp) and removed with everything in it when it goes.
#ifndef KVTIER_TESTS_TEMP_DIR_H_
#define KVTIER_TESTS_TEMP_DIR_H_

#include <stdlib.h>

#include <filesystem>
#include <string>

namespace kvtier::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix) {
    // mkdtemp fills in the name's last six characters.
    std::string name = (std::filesystem::temp_directory_path() / prefix).string() + std::string(6, 'X');
    if (mkdtemp(name.data()) == nullptr) std::abort();
    path_ = name;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TEMP_DIR_H_
