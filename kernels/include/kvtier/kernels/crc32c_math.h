// CRC32C (Castagnoli) as algebra, for host and device code alike: the
// checksum of a record put together from the raw CRCs of its parts, so a
// GPU can check a record in its memory with many threads at once (slab.cu),
// and the host can join the CRCs of pieces that arrive out of order
// (services/kvblock/crc32c.h).
//
// Polynomials are in the reflected order CRC32C registers use: bit 31
// holds x^0, bit 0 x^31. The raw CRC of bytes is the register after them
// from a zero register; it is linear, so raw(A || B) = raw(A) x^(8|B|) +
// raw(B), and zero bytes in front of A leave raw(A) as it is. The standard
// CRC32C (register started at and finished with all ones) is
// ~(raw(M) + ~0 x^(8|M|)).
#ifndef KVTIER_KERNELS_CRC32C_MATH_H_
#define KVTIER_KERNELS_CRC32C_MATH_H_

#include <cstdint>

#ifdef __CUDACC__
#define KVTIER_HOST_DEVICE __host__ __device__
#else
#define KVTIER_HOST_DEVICE
#endif

namespace kvtier::kernels {

inline constexpr uint32_t kCrc32cPolynomial = 0x82f63b78u;  // reflected
inline constexpr uint32_t kCrc32cOne = 1u << 31;            // x^0
inline constexpr uint32_t kCrc32cX = 1u << 30;              // x^1

// The register after one bit of a byte already xored in; also a * x.
KVTIER_HOST_DEVICE constexpr uint32_t Crc32cBitStep(uint32_t c) {
  return (c >> 1) ^ (kCrc32cPolynomial & (0u - (c & 1)));
}

// a * b mod the polynomial.
KVTIER_HOST_DEVICE constexpr uint32_t Crc32cMultiply(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (int i = 31; i >= 0; --i) {
    product ^= b & (0u - ((a >> i) & 1));
    b = Crc32cBitStep(b);  // b * x
  }
  return product;
}

// x^(8n) mod the polynomial: what n zero bytes multiply a register by.
KVTIER_HOST_DEVICE constexpr uint32_t Crc32cZeroBytesFactor(uint64_t n) {
  uint32_t power = kCrc32cX;
  for (int i = 0; i < 3; ++i) power = Crc32cMultiply(power, power);  // x^8
  uint32_t result = kCrc32cOne;
  for (; n != 0; n >>= 1) {
    if (n & 1) result = Crc32cMultiply(result, power);
    power = Crc32cMultiply(power, power);
  }
  return result;
}

// Slicing table entry: the raw CRC of byte b followed by k zero bytes
// (slicing-by-4 takes k = 0..3, by-8 k = 0..7).
KVTIER_HOST_DEVICE constexpr uint32_t Crc32cTableEntry(uint32_t k, uint32_t b) {
  uint32_t c = b;
  for (uint32_t i = 0; i < 8 * (k + 1); ++i) c = Crc32cBitStep(c);
  return c;
}

// The standard CRC32C of `bytes` bytes whose raw CRC is `raw`.
KVTIER_HOST_DEVICE constexpr uint32_t Crc32cFromRaw(uint32_t raw, uint64_t bytes) {
  return ~(raw ^ Crc32cMultiply(0xffffffffu, Crc32cZeroBytesFactor(bytes)));
}

// The raw CRC of A || B from raw(A), raw(B) and B's length.
KVTIER_HOST_DEVICE constexpr uint32_t Crc32cJoin(uint32_t raw_a, uint32_t raw_b, uint64_t bytes_b) {
  return Crc32cMultiply(raw_a, Crc32cZeroBytesFactor(bytes_b)) ^ raw_b;
}

// One slicing-by-4 step: the raw register `c` after four more bytes, given
// as a little-endian word (table[k][b] = Crc32cTableEntry(k, b)).
KVTIER_HOST_DEVICE inline uint32_t Crc32cWordStep(const uint32_t (*table)[256], uint32_t c, uint32_t word) {
  c ^= word;
  return table[3][c & 0xff] ^ table[2][(c >> 8) & 0xff] ^ table[1][(c >> 16) & 0xff] ^ table[0][c >> 24];
}

// A record checked in chunks of equal size counted from its first byte
// (aligned loads, one chunk a thread): its `whole` whole chunks fill the
// last of `slots` slots and the slots in front hold nothing (zero bytes in
// front change no raw CRC), so neighbouring slots join pairwise, level by
// level, each level with one factor; the bytes after the whole chunks join
// last (Crc32cJoin). The chunk a slot holds, or -1 for an empty slot.
KVTIER_HOST_DEVICE constexpr int64_t Crc32cChunkInSlot(uint64_t slot, uint64_t slots, uint64_t whole) {
  return slot + whole >= slots ? static_cast<int64_t>(slot + whole - slots) : -1;
}

}  // namespace kvtier::kernels

#endif  // KVTIER_KERNELS_CRC32C_MATH_H_
