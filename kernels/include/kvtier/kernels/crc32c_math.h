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

// A record of `bytes` bytes cut into `parts` (a power of two) segments of
// `segment` bytes each, a power of two, after `pad` zero bytes in front:
// part t holds the record's bytes [t * segment - pad, (t + 1) * segment -
// pad) that exist. Joining neighbours pairwise, level by level, multiplies
// by x^(8 segment 2^level): no lengths to work out per pair.
struct Crc32cSplit {
  uint64_t segment;
  uint64_t pad;
};
KVTIER_HOST_DEVICE constexpr Crc32cSplit SplitForCrc32c(uint64_t bytes, uint32_t parts) {
  uint64_t segment = 4;
  while (segment * parts < bytes) segment <<= 1;
  return {segment, segment * parts - bytes};
}

// The raw CRC of part `t` of a split record: its bytes that exist, read
// with byte(i) (i counted in the record), four at a time through a
// slicing-by-4 table (table[k][b] = Crc32cTableEntry(k, b)).
template <typename Byte>
KVTIER_HOST_DEVICE uint32_t Crc32cRawPart(const uint32_t (*table)[256], Byte byte, Crc32cSplit split, uint64_t t) {
  const uint64_t virtual_begin = t * split.segment, virtual_end = virtual_begin + split.segment;
  if (virtual_end <= split.pad) return 0;  // all padding
  const uint64_t end = virtual_end - split.pad;  // at most the record's size
  uint64_t i = virtual_begin > split.pad ? virtual_begin - split.pad : 0;
  uint32_t c = 0;
  for (; i + 4 <= end; i += 4) {
    c ^= uint32_t{byte(i)} | uint32_t{byte(i + 1)} << 8 | uint32_t{byte(i + 2)} << 16 | uint32_t{byte(i + 3)} << 24;
    c = table[3][c & 0xff] ^ table[2][(c >> 8) & 0xff] ^ table[1][(c >> 16) & 0xff] ^ table[0][c >> 24];
  }
  for (; i < end; ++i) c = (c >> 8) ^ table[0][(c ^ byte(i)) & 0xff];
  return c;
}

}  // namespace kvtier::kernels

#endif  // KVTIER_KERNELS_CRC32C_MATH_H_
