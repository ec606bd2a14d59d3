#include "services/cache/segment_spares.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace kvtier::cache {

void PunchAndClose(int fd, size_t bytes) {
  fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(bytes));
  close(fd);
}

int SealedMemfd(size_t bytes) {
  const int fd = memfd_create("kvtier-cache-segment", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -1;
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    close(fd);
    return -1;
  }
  return fd;
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
  for (int fd : retired_) PunchAndClose(fd, bytes_);
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
  PunchAndClose(fd, bytes_);  // the thread is behind: no more memory waits on it
}

uint64_t SegmentSpares::HeldBytes() {
  absl::MutexLock lock(&mu_);
  return uint64_t{Held()} * bytes_;
}

size_t SegmentSpares::Held() const { return ready_.size() + retired_.size() + (busy_ ? 1 : 0); }

bool SegmentSpares::HasWork() const { return stop_ || !retired_.empty() || (!failed_ && Held() < keep_); }

bool SegmentSpares::Idle() const {
  return retired_.empty() && !busy_ && (failed_ || ready_.size() >= keep_);
}

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
      // Old pages first: they are memory the arena no longer counts.
      const int fd = retired_.front();
      retired_.pop_front();
      busy_ = true;
      mu_.Unlock();
      PunchAndClose(fd, bytes_);
      mu_.Lock();
      busy_ = false;
      continue;
    }
    busy_ = true;
    mu_.Unlock();
    const int fd = SealedMemfd(bytes_);
    void* at = fd < 0 ? MAP_FAILED
                      : mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    const int error = errno;
    mu_.Lock();
    busy_ = false;
    if (at == MAP_FAILED) {
      if (fd >= 0) close(fd);
      std::fprintf(stderr,
                   "kvtier-cache: cannot make segments ahead (%s); new owners' pages fault in as written\n",
                   std::strerror(error));
      failed_ = true;
      continue;
    }
    ready_.push_back({fd, static_cast<uint8_t*>(at)});
  }
}

}  // namespace kvtier::cache
