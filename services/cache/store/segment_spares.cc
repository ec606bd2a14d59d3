#include "services/cache/store/segment_spares.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "services/base/log.h"

namespace kvtier::cache {

uint8_t* MapSealedMemfd(size_t bytes, uint8_t* at, int& fd) {
  fd = memfd_create("kvtier-cache-segment", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return nullptr;
  void* mapped = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(bytes)) == 0) {
    mapped = at != nullptr ? mmap(at, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0)
                           : mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  }
  // The future-write seal leaves the mapping just made writable, and only
  // it: so it comes after.
  if (mapped == MAP_FAILED ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0 ||
      fchmod(fd, 0400) != 0) {
    const int error = errno;
    if (mapped != MAP_FAILED && at == nullptr) munmap(mapped, bytes);
    close(fd);
    fd = -1;
    errno = error;
    return nullptr;
  }
  return static_cast<uint8_t*>(mapped);
}

SegmentSpares::SegmentSpares(size_t bytes, size_t keep)
    : bytes_(bytes), keep_(std::max<size_t>(keep, 1)), thread_([this] { Run(); }) {}

SegmentSpares::~SegmentSpares() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
  for (const Spare& s : ready_) {
    munmap(s.at, bytes_);
    close(s.fd);
  }
  for (int fd : retired_) close(fd);
}

std::optional<SegmentSpares::Spare> SegmentSpares::Take() {
  absl::MutexLock lock(&mu_);
  if (ready_.empty()) return std::nullopt;
  const Spare s = ready_.front();
  ready_.pop_front();
  return s;
}

bool SegmentSpares::MoveTo(const Spare& spare, uint8_t* to) {
  if (mremap(spare.at, bytes_, bytes_, MREMAP_MAYMOVE | MREMAP_FIXED, to) != MAP_FAILED) return true;
  munmap(spare.at, bytes_);
  close(spare.fd);
  return false;
}

void SegmentSpares::Retire(int fd) {
  {
    absl::MutexLock lock(&mu_);
    if (Held() < keep_) {
      retired_.push_back(fd);
      return;
    }
  }
  close(fd);  // the thread is behind: no more memory waits on it
}

uint64_t SegmentSpares::HeldBytes() {
  absl::MutexLock lock(&mu_);
  return uint64_t{Held()} * bytes_;
}

size_t SegmentSpares::Held() const { return ready_.size() + retired_.size() + (busy_ ? 1 : 0); }

bool SegmentSpares::HasWork() const { return stop_ || !retired_.empty() || (!failed_ && Held() < keep_); }

bool SegmentSpares::Idle() const { return retired_.empty() && !busy_ && (failed_ || ready_.size() >= keep_); }

void SegmentSpares::WaitIdle() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &SegmentSpares::Idle));
}

void SegmentSpares::Run() {
  absl::MutexLock lock(&mu_);
  while (true) {
    mu_.Await(absl::Condition(this, &SegmentSpares::HasWork));
    if (stop_) return;
    if (!retired_.empty()) {
      // Old memfds first: they are memory the arena no longer counts.
      const int fd = retired_.front();
      retired_.pop_front();
      busy_ = true;
      mu_.Unlock();
      close(fd);
      mu_.Lock();
      busy_ = false;
      continue;
    }
    busy_ = true;
    mu_.Unlock();
    int fd = -1;
    uint8_t* at = MapSealedMemfd(bytes_, nullptr, fd);
    const int error = errno;
    mu_.Lock();
    busy_ = false;
    if (at == nullptr) {
      Log(LogLevel::kWarning, "store",
          std::string("cannot make segments ahead (") + std::strerror(error) +
              "); new owners' pages fault in as written");
      failed_ = true;
      continue;
    }
    ready_.push_back({fd, at});
  }
}

}  // namespace kvtier::cache
