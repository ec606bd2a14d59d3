// A server that receives large messages (gRPC's read buffers, a megabyte
// at a time) frees and allocates heap memory by the megabyte all the time.
// glibc gives freed memory at an arena's top back to the kernel past a
// threshold that moves with the largest block freed so far, and under such
// traffic it may fall low enough that much of what arrives lands in pages
// the kernel must fault in and zero again, one by one.
#ifndef KVTIER_SERVICES_BASE_HEAP_REUSE_H_
#define KVTIER_SERVICES_BASE_HEAP_REUSE_H_

#include <cstdint>

namespace kvtier {

// Fixes glibc's two thresholds so that an arena keeps up to `kept` bytes
// freed at its top for reuse, and blocks up to half of that come from the
// heap (not a mapping of their own, unmapped when freed). False where the
// C library does not take them (then nothing changed).
bool KeepFreedHeapForReuse(uint64_t kept);

}  // namespace kvtier

#endif  // KVTIER_SERVICES_BASE_HEAP_REUSE_H_
