#include "services/base/watched_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace kvtier {

std::string FileSignature(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return "";
  return absl::StrCat(st.st_ino, ":", st.st_size, ":", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec);
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
  std::stringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) return absl::InvalidArgumentError(absl::StrCat("cannot read ", path));
  return bytes.str();
}

PeriodicTask::PeriodicTask(absl::Duration every, std::function<void()> task)
    : every_(every), task_(std::move(task)), thread_([this] {
        absl::MutexLock lock(&mu_);
        while (!mu_.AwaitWithTimeout(absl::Condition(&stop_), every_)) {
          mu_.Unlock();
          task_();
          mu_.Lock();
        }
      }) {}

PeriodicTask::~PeriodicTask() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

}  // namespace kvtier
