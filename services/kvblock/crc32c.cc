#include "services/kvblock/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kvtier/kernels/crc32c_math.h"

namespace kvtier::kvblock {
namespace {

// Slicing-by-8 tables: table[k][b] is the CRC of byte b followed by k zeros.
constexpr std::array<std::array<uint32_t, 256>, 8> MakeTables() {
  std::array<std::array<uint32_t, 256>, 8> t{};
  for (uint32_t k = 0; k < 8; ++k) {
    for (uint32_t b = 0; b < 256; ++b) t[k][b] = kernels::Crc32cTableEntry(k, b);
  }
  return t;
}
constexpr auto kTables = MakeTables();

// x^(2^k) mod the polynomial, k = 0..63: Crc32cCombine's powers from a
// table, where Crc32cZeroBytesFactor (for device code too) squares its way
// up each call; a Put combines a block's 27 slices.
constexpr std::array<uint32_t, 64> MakePowers() {
  std::array<uint32_t, 64> powers{};
  powers[0] = kernels::kCrc32cX;
  for (int k = 1; k < 64; ++k) powers[k] = kernels::Crc32cMultiply(powers[k - 1], powers[k - 1]);
  return powers;
}
constexpr auto kPowersOfX = MakePowers();

// The raw register update for one byte (no pre/post inversion).
constexpr uint32_t RawByte(uint32_t crc, uint8_t b) { return kTables[0][(crc ^ b) & 0xff] ^ (crc >> 8); }

#if defined(__x86_64__)
// The crc32 instruction has a latency of 3 cycles and a throughput of 1, so
// three independent streams over consecutive chunks run ~3x faster than one.
// Their results are joined with the linear map "append kChunk zero bytes"
// (crc(A||B) = Z(crc(A)) ^ crc0(B)), applied through four byte tables.
constexpr size_t kChunk = 1024;

struct ZeroShift {
  uint32_t t[4][256];
  ZeroShift() {
    uint32_t basis[32];
    for (int i = 0; i < 32; ++i) {
      uint32_t c = uint32_t{1} << i;
      for (size_t n = 0; n < kChunk; ++n) c = RawByte(c, 0);
      basis[i] = c;
    }
    for (int k = 0; k < 4; ++k) {
      for (uint32_t b = 0; b < 256; ++b) {
        uint32_t v = 0;
        for (int bit = 0; bit < 8; ++bit) {
          if (b & (1u << bit)) v ^= basis[8 * k + bit];
        }
        t[k][b] = v;
      }
    }
  }
  uint32_t operator()(uint32_t c) const {
    return t[0][c & 0xff] ^ t[1][(c >> 8) & 0xff] ^ t[2][(c >> 16) & 0xff] ^ t[3][c >> 24];
  }
};

__attribute__((target("sse4.2"))) uint64_t Crc64(uint64_t c, const uint8_t* p) {
  uint64_t word;
  std::memcpy(&word, p, 8);
  return __builtin_ia32_crc32di(c, word);
}

__attribute__((target("sse4.2"))) uint32_t ExtendHardware(uint32_t crc, const uint8_t* p, size_t n) {
  static const ZeroShift shift;
  uint64_t c = ~crc;
  for (; n >= 3 * kChunk; n -= 3 * kChunk, p += 3 * kChunk) {
    uint64_t a = c, b = 0, d = 0;
    for (size_t i = 0; i < kChunk; i += 8) {
      a = Crc64(a, p + i);
      b = Crc64(b, p + kChunk + i);
      d = Crc64(d, p + 2 * kChunk + i);
    }
    c = shift(shift(static_cast<uint32_t>(a)) ^ static_cast<uint32_t>(b)) ^ static_cast<uint32_t>(d);
  }
  for (; n >= 8; n -= 8, p += 8) c = Crc64(c, p);
  uint32_t c32 = static_cast<uint32_t>(c);
  for (; n > 0; --n, ++p) c32 = __builtin_ia32_crc32qi(c32, *p);
  return ~c32;
}

bool HaveSse42() {
  static const bool have = __builtin_cpu_supports("sse4.2");
  return have;
}

// Carry-less multiplication (VPCLMULQDQ, AVX-512): 256 bytes a step in four
// 512-bit accumulators, each 128-bit lane "folded" forward over the data
// after it, then the last 128 bits and the tail through the crc32
// instruction. A lane A = H x^64 + L (H: its first 8 bytes) standing D bits
// before lane B becomes H (x^(D+64) mod P) + L (x^D mod P) + B, which has the
// same CRC. In the reflected bit order the product of two 64-bit operands
// comes out one bit up, so the constants carry x^(D+63) and x^(D-1).
// About 3x the crc32 instruction's rate on data in cache.
struct FoldConstants {
  __m128i by128, by256, by384, by512, by2048;  // [lo: x^(D+63), hi: x^(D-1)], each mod P, reflected
  FoldConstants() : by128(Pair(128)), by256(Pair(256)), by384(Pair(384)), by512(Pair(512)), by2048(Pair(2048)) {}

  // x^e mod P (normal bit order: bit i is x^i), P = 0x1EDC6F41 with x^32.
  static uint64_t XPowMod(int e) {
    uint64_t r = 1;
    for (int i = 0; i < e; ++i) {
      r <<= 1;
      if (r & (uint64_t{1} << 32)) r ^= 0x11EDC6F41ull;
    }
    return r;
  }
  // The polynomial in a 64-bit lane as the data's lanes hold theirs: x^j at bit 63 - j.
  static uint64_t Reflect64(uint64_t v) {
    uint64_t r = 0;
    for (int i = 0; i < 64; ++i) r |= ((v >> i) & 1) << (63 - i);
    return r;
  }
  static __m128i Pair(int bits) {
    return _mm_set_epi64x(static_cast<long long>(Reflect64(XPowMod(bits - 1))),
                          static_cast<long long>(Reflect64(XPowMod(bits + 63))));
  }
};

#define KVTIER_CLMUL_TARGET __attribute__((target("avx512f,vpclmulqdq,pclmul,sse4.2")))

KVTIER_CLMUL_TARGET inline __m128i Fold128(__m128i a, __m128i k) {
  return _mm_xor_si128(_mm_clmulepi64_si128(a, k, 0x00), _mm_clmulepi64_si128(a, k, 0x11));
}

// `k` in each 128-bit lane (not _mm512_broadcast_i32x4: GCC 12's header
// warns that its own placeholder operand is uninitialized).
KVTIER_CLMUL_TARGET inline __m512i Broadcast(__m128i k) {
  const long long lo = _mm_cvtsi128_si64(k), hi = _mm_extract_epi64(k, 1);
  return _mm512_set_epi64(hi, lo, hi, lo, hi, lo, hi, lo);
}

// Each lane of `a` folded by the constants in `k` (broadcast), plus `b`.
KVTIER_CLMUL_TARGET inline __m512i Fold512(__m512i a, __m512i k, __m512i b) {
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(a, k, 0x00), _mm512_clmulepi64_epi128(a, k, 0x11), b,
                                   0x96);  // a ^ b ^ c
}

KVTIER_CLMUL_TARGET uint32_t ExtendCarryless(uint32_t crc, const uint8_t* p, size_t n) {
  static const FoldConstants k;
  // The running CRC enters as the first 4 bytes XORed with its complement,
  // as the crc32 instruction takes it.
  __m512i acc[4];
  for (int i = 0; i < 4; ++i) acc[i] = _mm512_loadu_si512(p + 64 * i);
  acc[0] = _mm512_xor_si512(acc[0], _mm512_zextsi128_si512(_mm_cvtsi32_si128(static_cast<int>(~crc))));
  p += 256, n -= 256;
  const __m512i by2048 = Broadcast(k.by2048), by512 = Broadcast(k.by512);
  for (; n >= 256; p += 256, n -= 256) {
    for (int i = 0; i < 4; ++i) acc[i] = Fold512(acc[i], by2048, _mm512_loadu_si512(p + 64 * i));
  }
  __m512i x = Fold512(Fold512(Fold512(acc[0], by512, acc[1]), by512, acc[2]), by512, acc[3]);
  for (; n >= 64; p += 64, n -= 64) x = Fold512(x, by512, _mm512_loadu_si512(p));
  // The four lanes onto the last (through memory: GCC 12's lane-extracting
  // intrinsics warn as above).
  alignas(64) uint8_t lanes[64];
  _mm512_store_si512(lanes, x);
  auto lane = [&](int j) { return _mm_load_si128(reinterpret_cast<const __m128i*>(lanes + 16 * j)); };
  __m128i last = lane(3);
  last = _mm_xor_si128(last, Fold128(lane(0), k.by384));
  last = _mm_xor_si128(last, Fold128(lane(1), k.by256));
  last = _mm_xor_si128(last, Fold128(lane(2), k.by128));
  uint64_t c = __builtin_ia32_crc32di(0, static_cast<uint64_t>(_mm_cvtsi128_si64(last)));
  c = __builtin_ia32_crc32di(c, static_cast<uint64_t>(_mm_extract_epi64(last, 1)));
  // The tail (under 64 bytes) continues from there; ExtendHardware takes
  // and gives the CRC's complement.
  return ExtendHardware(~static_cast<uint32_t>(c), p, n);
}

bool HaveCarryless() {
  static const bool have = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("vpclmulqdq") &&
                           __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.2");
  return have;
}
#endif

}  // namespace

uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  for (; size >= 8; size -= 8, p += 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = kTables[7][lo & 0xff] ^ kTables[6][(lo >> 8) & 0xff] ^ kTables[5][(lo >> 16) & 0xff] ^ kTables[4][lo >> 24] ^
        kTables[3][hi & 0xff] ^ kTables[2][(hi >> 8) & 0xff] ^ kTables[1][(hi >> 16) & 0xff] ^ kTables[0][hi >> 24];
  }
  for (; size > 0; --size, ++p) c = (c >> 8) ^ kTables[0][(c ^ *p) & 0xff];
  return ~c;
}

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size) {
#if defined(__x86_64__)
  if (size >= 256 && HaveCarryless()) return ExtendCarryless(crc, static_cast<const uint8_t*>(data), size);
  if (HaveSse42()) return ExtendHardware(crc, static_cast<const uint8_t*>(data), size);
#endif
  return Crc32cExtendPortable(crc, data, size);
}

uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, size_t size_b) {
  // crc(A || B) = crc(A) * x^(8 size_b) + crc(B): the pre- and
  // post-inversions of both cancel out. The power comes from the table of
  // x^(2^k), one product a set bit of 8 size_b.
  uint64_t bits = uint64_t{size_b} * 8;
  uint32_t shifted = crc_a;
  for (int k = 0; bits != 0; ++k, bits >>= 1) {
    if (bits & 1) shifted = kernels::Crc32cMultiply(kPowersOfX[k], shifted);
  }
  return shifted ^ crc_b;
}

}  // namespace kvtier::kvblock
