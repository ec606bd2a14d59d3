// Host memory ranges page-locked for a GPU's copies, each registered on
// its own (cudaHostRegister: the host tier pins its pages a segment at a
// time). CUDA refuses a copy whose host side spans two registrations, or
// one and unregistered memory, with "invalid argument", even where the
// bytes are adjacent; Split cuts runs at those borders. Plain C++ (tested
// without a GPU); thread-safe.
#ifndef KVTIER_KERNELS_PINNED_RANGES_H_
#define KVTIER_KERNELS_PINNED_RANGES_H_

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>
#include <span>
#include <vector>

#include "kvtier/kernels/cuda_slab.h"

namespace kvtier::kernels {

class PinnedRanges {
 public:
  void Add(const void* p, size_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    ranges_[Address(p)] = Address(p) + n;
  }
  void Remove(const void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    ranges_.erase(Address(p));
  }
  // `runs` into `out`, each cut where its host side enters or leaves a
  // pinned range (the pieces keep their order and slab offsets).
  void Split(std::span<const cuda::SlabRun> runs, std::vector<cuda::SlabRun>& out) const {
    out.clear();
    std::lock_guard<std::mutex> lock(mu_);
    for (const cuda::SlabRun& r : runs) {
      const uintptr_t first = Address(r.host), end = first + r.n;
      for (uintptr_t at = first; at < end;) {
        uintptr_t cut = end;
        const auto next = ranges_.upper_bound(at);  // the first range beginning after `at`
        if (next != ranges_.end()) cut = std::min(cut, next->first);
        if (next != ranges_.begin() && at < std::prev(next)->second) cut = std::min(cut, std::prev(next)->second);
        out.push_back({r.offset + (at - first), cut - at, reinterpret_cast<void*>(at)});
        at = cut;
      }
    }
  }

 private:
  static uintptr_t Address(const void* p) { return reinterpret_cast<uintptr_t>(p); }
  mutable std::mutex mu_;
  std::map<uintptr_t, uintptr_t> ranges_;  // first byte -> one past the last
};

}  // namespace kvtier::kernels

#endif  // KVTIER_KERNELS_PINNED_RANGES_H_
