#include "services/cache/store/arc_target.h"

#include <algorithm>

namespace kvtier::cache {

bool ArcTarget::Returning(uint64_t fingerprint, size_t held_blocks) {
  const double unit = 1.0 / static_cast<double>(std::max<size_t>(held_blocks, 1));
  // ARC's step: larger when the other kind of return is the more common.
  const auto step = [&](const Ghosts& other, const Ghosts& mine) {
    return unit * static_cast<double>(std::max<size_t>(1, other.size() / std::max<size_t>(mine.size(), 1)));
  };
  if (raising_.Contains(fingerprint)) {
    share_ = std::min(1.0, share_ + step(lowering_, raising_));
    raising_.Take(fingerprint);
    return true;
  }
  if (lowering_.Contains(fingerprint)) {
    share_ = std::max(floor_, share_ - step(raising_, lowering_));
    lowering_.Take(fingerprint);
    return true;
  }
  return false;
}

void ArcTarget::Evicted(uint64_t fingerprint, bool raises, size_t held_blocks) {
  (raises ? raising_ : lowering_).Add(fingerprint, held_blocks);
}

size_t ArcTarget::MemoryBytes() const { return raising_.MemoryBytes() + lowering_.MemoryBytes(); }

}  // namespace kvtier::cache
