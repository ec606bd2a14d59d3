#include "services/base/heap_reuse.h"

#include <malloc.h>

namespace kvtier {

bool KeepFreedHeapForReuse(uint64_t kept) {
  if (kept < 2 || kept > (uint64_t{1} << 30)) return false;
  // Setting either also stops glibc from moving both on its own.
  return mallopt(M_MMAP_THRESHOLD, static_cast<int>(kept / 2)) == 1 &&
         mallopt(M_TRIM_THRESHOLD, static_cast<int>(kept)) == 1;
}

}  // namespace kvtier
