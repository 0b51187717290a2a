// Batch generation of the Philox stream (see philox.hpp). The SIMD paths keep one Philox
// instance per 64-bit lane, so the 32x32->64 multiply of a round is a single vpmuludq and its
// high half one shift; several groups of 8 instances are interleaved to hide the multiply latency
// (four with AVX-512's 32 registers, two with AVX2's 16). The baseline runs Random123 itself.
#include "philox.hpp"

#include "simd.hpp"

namespace gcomp::detail {

namespace {
constexpr std::uint32_t kM0 = 0xD2511F53u;  // Philox4x32 multipliers and Weyl key increments
constexpr std::uint32_t kM1 = 0xCD9E8D57u;
constexpr std::uint32_t kW0 = 0x9E3779B9u;
constexpr std::uint32_t kW1 = 0xBB67AE85u;
}  // namespace

void philox_fill_reference(const PhiloxStream& s, std::uint64_t first, std::size_t count,
                           std::uint32_t* out) noexcept {
  r123::Philox4x32 rng;
  const r123::Philox4x32::key_type key = {{s.k0, s.k1}};
  for (std::size_t base = 0; base < count; base += 32) {
    const std::uint64_t g = (first + base) >> 5;
    for (std::uint32_t j = 0; j < 8; ++j) {
      const std::uint64_t block = 8 * g + j;
      const r123::Philox4x32::ctr_type ctr = {
          {static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32), s.codec, 0}};
      const auto r = rng(ctr, key);
      for (int w = 0; w < 4; ++w) out[base + 8 * w + j] = r[w];
    }
  }
}

#if GCOMP_X86
namespace {
template <int C>
GCOMP_TARGET_AVX512 inline void philox_groups(const PhiloxStream& s, std::uint64_t g0,
                                              std::uint32_t* out) noexcept {
  __m512i x0[C], x1[C], x2[C], x3[C];
  const __m512i lane = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
  for (int c = 0; c < C; ++c) {
    x0[c] = _mm512_add_epi64(_mm512_set1_epi64(static_cast<long long>(8 * (g0 + c))), lane);
    x1[c] = _mm512_srli_epi64(x0[c], 32);
    x2[c] = _mm512_set1_epi64(s.codec);
    x3[c] = _mm512_setzero_si512();
  }
  const __m512i m0 = _mm512_set1_epi64(kM0);
  const __m512i m1 = _mm512_set1_epi64(kM1);
  std::uint32_t a = s.k0;
  std::uint32_t b = s.k1;
  for (int r = 0; r < 10; ++r) {
    const __m512i ka = _mm512_set1_epi64(a);
    const __m512i kb = _mm512_set1_epi64(b);
    for (int c = 0; c < C; ++c) {
      // Only the low 32 bits of each lane are meaningful; vpmuludq reads just those.
      const __m512i p0 = _mm512_mul_epu32(x0[c], m0);
      const __m512i p1 = _mm512_mul_epu32(x2[c], m1);
      x0[c] = _mm512_ternarylogic_epi64(_mm512_srli_epi64(p1, 32), x1[c], ka, 0x96);
      x2[c] = _mm512_ternarylogic_epi64(_mm512_srli_epi64(p0, 32), x3[c], kb, 0x96);
      x1[c] = p1;
      x3[c] = p0;
    }
    a += kW0;
    b += kW1;
  }
  for (int c = 0; c < C; ++c) {
    std::uint32_t* o = out + 32 * c;
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 0), _mm512_cvtepi64_epi32(x0[c]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 8), _mm512_cvtepi64_epi32(x1[c]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 16), _mm512_cvtepi64_epi32(x2[c]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 24), _mm512_cvtepi64_epi32(x3[c]));
  }
}

// The low dwords of two vectors of four 64-bit lanes (blocks 0..3 and 4..7), in block order.
GCOMP_TARGET_AVX2 inline __m256i words(__m256i lo4, __m256i hi4) noexcept {
  const __m256i low = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  return _mm256_permute2x128_si256(_mm256_permutevar8x32_epi32(lo4, low),
                                   _mm256_permutevar8x32_epi32(hi4, low), 0x20);
}

// The AVX2 form: four 64-bit lanes per vector, so a group of 8 blocks is two vectors (blocks
// 8g..8g+3 and 8g+4..8g+7); the three-way xor is two xors, and the low halves of the lanes are
// gathered by a permute for the store.
template <int C>
GCOMP_TARGET_AVX2 inline void philox_groups_avx2(const PhiloxStream& s, std::uint64_t g0,
                                                 std::uint32_t* out) noexcept {
  constexpr int V = 2 * C;
  __m256i x0[V], x1[V], x2[V], x3[V];
  const __m256i lane = _mm256_setr_epi64x(0, 1, 2, 3);
  for (int v = 0; v < V; ++v) {
    const std::uint64_t first = 8 * (g0 + static_cast<std::uint64_t>(v / 2)) + 4 * (v % 2);
    x0[v] = _mm256_add_epi64(_mm256_set1_epi64x(static_cast<long long>(first)), lane);
    x1[v] = _mm256_srli_epi64(x0[v], 32);
    x2[v] = _mm256_set1_epi64x(s.codec);
    x3[v] = _mm256_setzero_si256();
  }
  const __m256i m0 = _mm256_set1_epi64x(kM0);
  const __m256i m1 = _mm256_set1_epi64x(kM1);
  std::uint32_t a = s.k0;
  std::uint32_t b = s.k1;
  for (int r = 0; r < 10; ++r) {
    const __m256i ka = _mm256_set1_epi64x(a);
    const __m256i kb = _mm256_set1_epi64x(b);
    for (int v = 0; v < V; ++v) {
      const __m256i p0 = _mm256_mul_epu32(x0[v], m0);
      const __m256i p1 = _mm256_mul_epu32(x2[v], m1);
      x0[v] = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p1, 32), x1[v]), ka);
      x2[v] = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p0, 32), x3[v]), kb);
      x1[v] = p1;
      x3[v] = p0;
    }
    a += kW0;
    b += kW1;
  }
  for (int c = 0; c < C; ++c) {
    auto* o = reinterpret_cast<__m256i*>(out + 32 * c);
    _mm256_storeu_si256(o + 0, words(x0[2 * c], x0[2 * c + 1]));
    _mm256_storeu_si256(o + 1, words(x1[2 * c], x1[2 * c + 1]));
    _mm256_storeu_si256(o + 2, words(x2[2 * c], x2[2 * c + 1]));
    _mm256_storeu_si256(o + 3, words(x3[2 * c], x3[2 * c + 1]));
  }
}

GCOMP_TARGET_AVX2 void philox_fill_avx2(const PhiloxStream& s, std::uint64_t first,
                                        std::size_t count, std::uint32_t* out) noexcept {
  std::uint64_t g = first >> 5;
  std::size_t groups = count >> 5;
  while (groups >= 2) {
    philox_groups_avx2<2>(s, g, out);
    g += 2;
    groups -= 2;
    out += 64;
  }
  if (groups > 0) philox_groups_avx2<1>(s, g, out);
}

GCOMP_TARGET_AVX512 void philox_fill_avx512(const PhiloxStream& s, std::uint64_t first,
                                            std::size_t count, std::uint32_t* out) noexcept {
  std::uint64_t g = first >> 5;
  std::size_t groups = count >> 5;
  while (groups >= 4) {
    philox_groups<4>(s, g, out);
    g += 4;
    groups -= 4;
    out += 128;
  }
  while (groups > 0) {
    philox_groups<1>(s, g, out);
    g += 1;
    groups -= 1;
    out += 32;
  }
}
}  // namespace
#endif

void philox_fill(const PhiloxStream& s, std::uint64_t first, std::size_t count,
                 std::uint32_t* out) noexcept {
#if GCOMP_X86
  switch (simd_level()) {
    case SimdLevel::avx512:
      return philox_fill_avx512(s, first, count, out);
    case SimdLevel::avx2:
      return philox_fill_avx2(s, first, count, out);
    default:
      break;
  }
#endif
  philox_fill_reference(s, first, count, out);
}

}  // namespace gcomp::detail

namespace gcomp {

std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t tensor, std::uint64_t step,
                          std::uint64_t rank) noexcept {
  // Two Philox4x32-10 calls: the seed keys a draw over the rank, which keys a draw over
  // (tensor, step); every input bit reaches the result.
  r123::Philox4x32 rng;
  const auto lo = [](std::uint64_t v) { return static_cast<std::uint32_t>(v); };
  const auto hi = [](std::uint64_t v) { return static_cast<std::uint32_t>(v >> 32); };
  const auto k = rng({{lo(rank), hi(rank), 0x67636d70u, 0}}, {{lo(seed), hi(seed)}});
  const auto r = rng({{lo(tensor), hi(tensor), lo(step), hi(step)}}, {{k[0], k[1]}});
  return (static_cast<std::uint64_t>(r[1]) << 32) | r[0];
}

}  // namespace gcomp
