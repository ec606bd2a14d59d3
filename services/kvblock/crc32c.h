// CRC32C (Castagnoli), the checksum of every stored block. Uses carry-less
// multiplication (VPCLMULQDQ, AVX-512) for 256 bytes and more when the CPU
// has it, else the SSE4.2 crc32 instruction, else a table; all give the
// same value. Thread-safe.
#ifndef KVTIER_SERVICES_KVBLOCK_CRC32C_H_
#define KVTIER_SERVICES_KVBLOCK_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace kvtier::kvblock {

// CRC32C of `data`, continuing from `crc` (the value for the bytes before
// it; 0 to start).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size);
inline uint32_t Crc32c(const void* data, size_t size) { return Crc32cExtend(0, data, size); }

// The CRC32C of A followed by B, from crc(A), crc(B) and B's length: a
// record's checksum put together from pieces that arrive in any order.
uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, size_t size_b);

// The table-driven path alone, for tests that compare both paths.
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t size);

}  // namespace kvtier::kvblock

#endif  // KVTIER_SERVICES_KVBLOCK_CRC32C_H_
