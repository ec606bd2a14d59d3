// Memfds for a shared PageArena's segments, made ahead on a thread of their
// own. A segment that a reader mapped must get a new memfd when it changes
// owner (see page_arena.h), and a new memfd's pages are allocated, zeroed
// and mapped one fault at a time as they are first written, several times
// slower than writes into pages already mapped, which made a store into a
// full cache that fast-path readers use slower by as much
// (load/segment_reuse_bench). This thread makes sealed memfds with their pages
// already mapped (MAP_POPULATE), and the arena moves one over the segment's
// addresses with mremap, which moves the page tables and copies nothing.
// It also closes the memfds segments let go, off the store's path too.
// Thread-safe.
#ifndef KVTIER_SERVICES_CACHE_STORE_SEGMENT_SPARES_H_
#define KVTIER_SERVICES_CACHE_STORE_SEGMENT_SPARES_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <thread>

#include "absl/synchronization/mutex.h"

namespace kvtier::cache {

// A new memfd of `bytes` mapped read-write and shared, at `at` (MAP_FIXED)
// or, with `at` null, where the kernel likes with its pages populated; its
// descriptor in `fd`. Then sealed, so that whoever holds a descriptor of
// it (a same-host reader, who may reopen it through /proc with any mode)
// can neither shrink nor grow it under another's mapping (no SIGBUS) nor
// write it (F_SEAL_FUTURE_WRITE: no write(), no new writable mapping, no
// hole punched); only this mapping writes. Mode 0400, so that other users
// cannot even reopen it. Null (and `fd` -1) on failure.
uint8_t* MapSealedMemfd(size_t bytes, uint8_t* at, int& fd);

class SegmentSpares {
 public:
  // Keeps up to `keep` memfds of `bytes` ready (at least one); at most that
  // many memfds are held at once, ready or waiting to be closed.
  SegmentSpares(size_t bytes, size_t keep);
  ~SegmentSpares();  // joins the thread; retired memfds are closed first
  SegmentSpares(const SegmentSpares&) = delete;
  SegmentSpares& operator=(const SegmentSpares&) = delete;

  size_t bytes() const { return bytes_; }
  // Bytes of the memfds held now, ready or waiting to be closed.
  uint64_t HeldBytes();

  // A ready memfd, mapped read-write at `at` with every page present (all
  // zeros), now the taker's; none when none is ready (the taker makes its
  // own).
  struct Spare {
    int fd;
    uint8_t* at;
  };
  std::optional<Spare> Take();
  // Moves a taken spare's mapping over [to, to + bytes()), replacing what
  // was mapped there. False (the spare unmapped and closed) if that fails.
  bool MoveTo(const Spare& spare, uint8_t* to);
  // Closes `fd` on the thread (at once when `keep` are held). The write
  // seal keeps its pages from being punched out: a reader that still maps
  // it keeps reading the old owner's bytes (which it was allowed to read)
  // until it unmaps, and only then are they freed.
  void Retire(int fd);

  // Waits until every retired memfd is closed and `keep` spares are ready
  // (or the thread has given up making them): for tests and benchmarks.
  void WaitIdle();

 private:
  void Run();
  size_t Held() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t bytes_;
  const size_t keep_;
  absl::Mutex mu_;
  std::deque<Spare> ready_ ABSL_GUARDED_BY(mu_);
  std::deque<int> retired_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;    // the thread closes one or makes one
  bool failed_ ABSL_GUARDED_BY(mu_) = false;  // could not make one: makes no more
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_STORE_SEGMENT_SPARES_H_
