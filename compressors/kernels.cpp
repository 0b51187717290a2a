// The element-wise kernels (kernels.hpp), each compiled at every SIMD level by GCOMP_MULTIVERSION.
// Each *_body is the one definition: a plain loop the compiler vectorizes for the level of the
// function it is inlined into. The branch-free forms (a running minimum of ~bits & kInfBits finds
// a non-finite value, as any of its exponent bits unset makes the term non-zero) are what let it.
#include "kernels.hpp"

#include <algorithm>
#include <cstring>

#include "bytes.hpp"
#include "half.hpp"
#include "simd.hpp"

namespace gcomp::detail {

namespace {

GCOMP_ALWAYS_INLINE bool add_checked_body(const float* x, const float* e, std::size_t n,
                                          float* v) noexcept {
  std::uint32_t m = kInfBits;
  for (std::size_t i = 0; i < n; ++i) {
    v[i] = x[i] + e[i];
    m = std::min(m, ~float_bits(v[i]) & kInfBits);
  }
  return m == 0;
}

GCOMP_ALWAYS_INLINE void add_body(const float* x, const float* e, std::size_t n,
                                  float* v) noexcept {
  for (std::size_t i = 0; i < n; ++i) v[i] = x[i] + e[i];
}

GCOMP_ALWAYS_INLINE bool any_nonfinite_body(const float* x, std::size_t n) noexcept {
  std::uint32_t m = kInfBits;
  for (std::size_t i = 0; i < n; ++i) m = std::min(m, ~float_bits(x[i]) & kInfBits);
  return m == 0;
}

GCOMP_ALWAYS_INLINE bool any_nonfinite_sum_body(const float* x, const float* e,
                                                std::size_t n) noexcept {
  std::uint32_t m = kInfBits;
  for (std::size_t i = 0; i < n; ++i) m = std::min(m, ~float_bits(x[i] + e[i]) & kInfBits);
  return m == 0;
}

GCOMP_ALWAYS_INLINE std::uint32_t max_abs_bits_body(const float* x, std::size_t n) noexcept {
  std::uint32_t m = 0;
  for (std::size_t i = 0; i < n; ++i) m = std::max(m, abs_bits(x[i]));
  return m;
}

GCOMP_ALWAYS_INLINE std::uint32_t max_abs_bits_sum_body(const float* x, const float* e,
                                                        std::size_t n) noexcept {
  std::uint32_t m = 0;
  for (std::size_t i = 0; i < n; ++i) m = std::max(m, abs_bits(x[i] + e[i]));
  return m;
}

GCOMP_ALWAYS_INLINE std::uint32_t add_max_abs_bits_body(const float* x, const float* e,
                                                        std::size_t n, float* v) noexcept {
  std::uint32_t m = 0;
  for (std::size_t i = 0; i < n; ++i) {
    v[i] = x[i] + e[i];
    m = std::max(m, abs_bits(v[i]));
  }
  return m;
}

GCOMP_ALWAYS_INLINE bool abs_keys_body(const float* v, std::size_t n,
                                       std::uint32_t* keys) noexcept {
  std::uint32_t mx = 0;
  for (std::size_t i = 0; i < n; ++i) {
    keys[i] = abs_bits(v[i]);
    mx = std::max(mx, keys[i]);
  }
  return mx >= kInfBits;
}

// Branch-free: each position is written, and kept when its key passes.
GCOMP_ALWAYS_INLINE std::size_t positions_at_least_from(std::size_t i, std::size_t c,
                                                        const std::uint32_t* keys, std::size_t n,
                                                        std::uint32_t t,
                                                        std::uint32_t* pos) noexcept {
  for (; i < n; ++i) {
    pos[c] = static_cast<std::uint32_t>(i);
    c += keys[i] >= t ? 1 : 0;
  }
  return c;
}

GCOMP_ALWAYS_INLINE std::size_t positions_at_least_body(const std::uint32_t* keys, std::size_t n,
                                                        std::uint32_t t,
                                                        std::uint32_t* pos) noexcept {
  return positions_at_least_from(0, 0, keys, n, t, pos);
}

// One element of encode_*: v, its check term (zero iff v is NaN/Inf) and the value sent.
GCOMP_ALWAYS_INLINE std::uint32_t check_term(float v) noexcept { return ~float_bits(v) & kInfBits; }

GCOMP_ALWAYS_INLINE std::uint16_t bf16_of(float v) noexcept {
  // float_to_bf16 without the branch, so that loops over it vectorize: saturate, then round.
  const std::uint32_t u = float_bits(v);
  const std::uint32_t a = u & 0x7fffffffu;
  const std::uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return static_cast<std::uint16_t>(a >= 0x7f7f8000u ? (((u >> 16) & 0x8000u) | 0x7f7fu) : r);
}

GCOMP_ALWAYS_INLINE bool encode_f32_body(const float* x, const float* e, std::size_t n,
                                         std::byte* out, float* e_new) noexcept {
  std::uint32_t m = kInfBits;
  if (!e) {
    for (std::size_t i = 0; i < n; ++i) m = std::min(m, check_term(x[i]));
    std::memcpy(out, x, n * sizeof(float));
    return m == 0;
  }
  for (std::size_t i = 0; i < n; ++i) {
    const float v = x[i] + e[i];
    m = std::min(m, check_term(v));
    store_le<float>(out + 4 * i, v);
  }
  // Apart from the loop: memset's string stores skip reading the lines they overwrite.
  std::memset(e_new, 0, n * sizeof(float));
  return m == 0;
}

GCOMP_ALWAYS_INLINE bool encode_bf16_body(const float* x, const float* e, std::size_t n,
                                          std::byte* out, float* e_new) noexcept {
  std::uint32_t m = kInfBits;
  if (!e) {
    for (std::size_t i = 0; i < n; ++i) {
      m = std::min(m, check_term(x[i]));
      store_le<std::uint16_t>(out + 2 * i, bf16_of(x[i]));
    }
    return m == 0;
  }
  for (std::size_t i = 0; i < n; ++i) {
    const float v = x[i] + e[i];
    m = std::min(m, check_term(v));
    const std::uint16_t h = bf16_of(v);
    store_le<std::uint16_t>(out + 2 * i, h);
    e_new[i] = v - bf16_to_float(h);
  }
  return m == 0;
}

// encode_half from element i on, in scalar code (the reference; also the SIMD forms' tails).
GCOMP_ALWAYS_INLINE std::uint32_t encode_half_from(std::size_t i, const float* x, const float* e,
                                                   std::size_t n, std::byte* out, float* e_new,
                                                   std::uint32_t m) noexcept {
  for (; i < n; ++i) {
    const float v = e ? x[i] + e[i] : x[i];
    m = std::min(m, check_term(v));
    const std::uint16_t h = float_to_half(v);
    store_le<std::uint16_t>(out + 2 * i, h);
    if (e) e_new[i] = v - half_to_float(h);
  }
  return m;
}

GCOMP_ALWAYS_INLINE bool encode_half_body(const float* x, const float* e, std::size_t n,
                                          std::byte* out, float* e_new) noexcept {
  return encode_half_from(0, x, e, n, out, e_new, kInfBits) == 0;
}

GCOMP_ALWAYS_INLINE void add_scaled_f32_body(float* acc, const std::byte* v, float alpha,
                                             std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) acc[i] += alpha * load_le<float>(v + 4 * i);
}

GCOMP_ALWAYS_INLINE void add_scaled_bf16_body(float* acc, const std::byte* v, float alpha,
                                              std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i)
    acc[i] += alpha * bf16_to_float(load_le<std::uint16_t>(v + 2 * i));
}

GCOMP_ALWAYS_INLINE void add_scaled_half_from(std::size_t i, float* acc, const std::byte* v,
                                              float alpha, std::size_t n) noexcept {
  for (; i < n; ++i) acc[i] += alpha * half_to_float(load_le<std::uint16_t>(v + 2 * i));
}

GCOMP_ALWAYS_INLINE void add_scaled_half_body(float* acc, const std::byte* v, float alpha,
                                              std::size_t n) noexcept {
  add_scaled_half_from(0, acc, v, alpha, n);
}

GCOMP_ALWAYS_INLINE void subtract_signs_body(float* e, std::size_t n, float scale) noexcept {
  for (std::size_t i = 0; i < n; ++i) e[i] -= e[i] < 0 ? -scale : scale;
}

template <class I, bool F16>
GCOMP_ALWAYS_INLINE void scatter_add_as(float* acc, const std::byte* ip, const std::byte* vp,
                                        std::size_t nnz, float alpha) noexcept {
  for (std::size_t j = 0; j < nnz; ++j) {
    const float v =
        F16 ? half_to_float(load_le<std::uint16_t>(vp + 2 * j)) : load_le<float>(vp + 4 * j);
    acc[load_le<I>(ip + sizeof(I) * j)] += alpha * v;
  }
}

GCOMP_ALWAYS_INLINE void scatter_add_body(float* acc, const std::byte* ip, const std::byte* vp,
                                          std::size_t nnz, std::size_t index_bytes, bool fp16,
                                          float alpha) noexcept {
  if (index_bytes == 4) {
    fp16 ? scatter_add_as<std::uint32_t, true>(acc, ip, vp, nnz, alpha)
         : scatter_add_as<std::uint32_t, false>(acc, ip, vp, nnz, alpha);
  } else {
    fp16 ? scatter_add_as<std::uint64_t, true>(acc, ip, vp, nnz, alpha)
         : scatter_add_as<std::uint64_t, false>(acc, ip, vp, nnz, alpha);
  }
}

// Branch-free over all entries (each index against its predecessor, both loaded), so that it
// vectorizes; a bad payload is then searched for its first fault by the caller.
template <class I>
GCOMP_ALWAYS_INLINE bool indices_valid_as(const std::byte* ip, std::size_t nnz,
                                          std::uint64_t n) noexcept {
  if (nnz == 0) return true;
  bool bad = load_le<I>(ip) >= n;
  for (std::size_t j = 1; j < nnz; ++j) {
    const I cur = load_le<I>(ip + sizeof(I) * j);
    const I prev = load_le<I>(ip + sizeof(I) * (j - 1));
    bad |= (cur <= prev) | (cur >= n);
  }
  return !bad;
}

GCOMP_ALWAYS_INLINE bool indices_valid_body(const std::byte* ip, std::size_t nnz, std::size_t bytes,
                                            std::uint64_t n) noexcept {
  return bytes == 4 ? indices_valid_as<std::uint32_t>(ip, nnz, n)
                    : indices_valid_as<std::uint64_t>(ip, nnz, n);
}

GCOMP_ALWAYS_INLINE bool any_inf_bits_body(const std::byte* d, std::size_t n, std::size_t bytes,
                                           std::uint32_t inf) noexcept {
  std::uint32_t m = inf;
  if (bytes == 4) {
    for (std::size_t i = 0; i < n; ++i) m = std::min(m, ~load_le<std::uint32_t>(d + 4 * i) & inf);
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      m = std::min<std::uint32_t>(
          m, ~static_cast<std::uint32_t>(load_le<std::uint16_t>(d + 2 * i)) & inf);
    }
  }
  return m == 0;
}

#if GCOMP_X86
// fp16 by the hardware's conversion: clamp to +-65504 first (saturating, as float_to_half), then
// round to nearest even. Whole vectors here; the tail in encode_half_from.
GCOMP_TARGET_AVX512 bool encode_half_avx512(const float* x, const float* e, std::size_t n,
                                            std::byte* out, float* e_new) noexcept {
  const __m512 hi = _mm512_set1_ps(kHalfMax);
  const __m512 lo = _mm512_set1_ps(-kHalfMax);
  const __m512i inf = _mm512_set1_epi32(static_cast<int>(kInfBits));
  __m512i vm = inf;
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_loadu_ps(x + i);
    if (e) v = _mm512_add_ps(v, _mm512_loadu_ps(e + i));
    vm = _mm512_min_epu32(vm, _mm512_andnot_si512(_mm512_castps_si512(v), inf));
    const __m512 c = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
    const __m256i h = _mm512_cvtps_ph(c, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * i), h);
    if (e) _mm512_storeu_ps(e_new + i, _mm512_sub_ps(v, _mm512_cvtph_ps(h)));
  }
  const auto m = static_cast<std::uint32_t>(_mm512_reduce_min_epu32(vm));
  return encode_half_from(i, x, e, n, out, e_new, m) == 0;
}

GCOMP_TARGET_AVX2 bool encode_half_avx2(const float* x, const float* e, std::size_t n,
                                        std::byte* out, float* e_new) noexcept {
  const __m256 hi = _mm256_set1_ps(kHalfMax);
  const __m256 lo = _mm256_set1_ps(-kHalfMax);
  const __m256i inf = _mm256_set1_epi32(static_cast<int>(kInfBits));
  __m256i vm = inf;
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    if (e) v = _mm256_add_ps(v, _mm256_loadu_ps(e + i));
    vm = _mm256_min_epu32(vm, _mm256_andnot_si256(_mm256_castps_si256(v), inf));
    const __m256 c = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
    const __m128i h = _mm256_cvtps_ph(c, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), h);
    if (e) _mm256_storeu_ps(e_new + i, _mm256_sub_ps(v, _mm256_cvtph_ps(h)));
  }
  alignas(32) std::uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), vm);
  return encode_half_from(i, x, e, n, out, e_new, *std::min_element(lanes, lanes + 8)) == 0;
}

// The lanes of each 8-bit mask, in order, as bytes (a branch-free compress for AVX2).
struct LaneTable {
  std::uint64_t lanes[256];
  constexpr LaneTable() : lanes() {
    for (unsigned m = 0; m < 256; ++m) {
      std::uint64_t packed = 0;
      unsigned c = 0;
      for (unsigned l = 0; l < 8; ++l) {
        if (m & (1u << l)) packed |= static_cast<std::uint64_t>(l) << (8 * c++);
      }
      lanes[m] = packed;
    }
  }
};
constexpr LaneTable kLaneTable;

// 8 keys a time, branch-free: an unsigned compare (max(k, t) == k), the passing lanes' positions
// gathered by a permutation from the table, a full store and the count advanced by the
// popcount (top-k keeps about 1% of the keys, at random places: a branch would mispredict).
GCOMP_TARGET_AVX2 std::size_t positions_at_least_avx2(const std::uint32_t* keys, std::size_t n,
                                                      std::uint32_t t,
                                                      std::uint32_t* pos) noexcept {
  const __m256i vt = _mm256_set1_epi32(static_cast<int>(t));
  __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i eight = _mm256_set1_epi32(8);
  std::size_t i = 0;
  std::size_t c = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i k = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(keys + i));
    const __m256i pass = _mm256_cmpeq_epi32(_mm256_max_epu32(k, vt), k);
    const auto m = static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(pass)));
    const __m256i lanes =
        _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(kLaneTable.lanes[m])));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(pos + c),
                        _mm256_permutevar8x32_epi32(idx, lanes));
    c += static_cast<std::size_t>(__builtin_popcount(m));
    idx = _mm256_add_epi32(idx, eight);
  }
  return positions_at_least_from(i, c, keys, n, t, pos);
}

// Compress the passing positions of 16 keys at a time (a register compress and a full store:
// the memory form of vpcompressd is slow on some CPUs).
GCOMP_TARGET_AVX512 std::size_t positions_at_least_avx512(const std::uint32_t* keys, std::size_t n,
                                                          std::uint32_t t,
                                                          std::uint32_t* pos) noexcept {
  const __m512i vt = _mm512_set1_epi32(static_cast<int>(t));
  const __m512i sixteen = _mm512_set1_epi32(16);
  __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  std::size_t i = 0;
  std::size_t c = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i k = _mm512_loadu_si512(keys + i);
    const __mmask16 m = _mm512_cmpge_epu32_mask(k, vt);
    if (m != 0) {
      _mm512_storeu_si512(pos + c, _mm512_maskz_compress_epi32(m, idx));
      c += static_cast<std::size_t>(__builtin_popcount(m));
    }
    idx = _mm512_add_epi32(idx, sixteen);
  }
  return positions_at_least_from(i, c, keys, n, t, pos);
}

GCOMP_TARGET_AVX512 void add_scaled_half_avx512(float* acc, const std::byte* v, float alpha,
                                                std::size_t n) noexcept {
  const __m512 a = _mm512_set1_ps(alpha);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 d =
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + 2 * i)));
    _mm512_storeu_ps(acc + i, _mm512_add_ps(_mm512_loadu_ps(acc + i), _mm512_mul_ps(a, d)));
  }
  add_scaled_half_from(i, acc, v, alpha, n);
}

GCOMP_TARGET_AVX2 void add_scaled_half_avx2(float* acc, const std::byte* v, float alpha,
                                            std::size_t n) noexcept {
  const __m256 a = _mm256_set1_ps(alpha);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v + 2 * i)));
    _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), _mm256_mul_ps(a, d)));
  }
  add_scaled_half_from(i, acc, v, alpha, n);
}
#endif

}  // namespace

GCOMP_MULTIVERSION(bool, add_checked,
                   (const float* x, const float* e, std::size_t n, float* v) noexcept, (x, e, n, v))
GCOMP_MULTIVERSION(void, add, (const float* x, const float* e, std::size_t n, float* v) noexcept,
                   (x, e, n, v))
GCOMP_MULTIVERSION(bool, any_nonfinite, (const float* x, std::size_t n) noexcept, (x, n))
GCOMP_MULTIVERSION(bool, any_nonfinite_sum,
                   (const float* x, const float* e, std::size_t n) noexcept, (x, e, n))
GCOMP_MULTIVERSION(std::uint32_t, max_abs_bits, (const float* x, std::size_t n) noexcept, (x, n))
GCOMP_MULTIVERSION(std::uint32_t, max_abs_bits_sum,
                   (const float* x, const float* e, std::size_t n) noexcept, (x, e, n))
GCOMP_MULTIVERSION(std::uint32_t, add_max_abs_bits,
                   (const float* x, const float* e, std::size_t n, float* v) noexcept,
                   (x, e, n, v))
GCOMP_MULTIVERSION(bool, abs_keys, (const float* v, std::size_t n, std::uint32_t* keys) noexcept,
                   (v, n, keys))
GCOMP_MULTIVERSION(void, subtract_signs, (float* e, std::size_t n, float scale) noexcept,
                   (e, n, scale))
GCOMP_MULTIVERSION(void, scatter_add,
                   (float* acc, const std::byte* ip, const std::byte* vp, std::size_t nnz,
                    std::size_t index_bytes, bool fp16, float alpha) noexcept,
                   (acc, ip, vp, nnz, index_bytes, fp16, alpha))
GCOMP_MULTIVERSION(bool, indices_valid,
                   (const std::byte* ip, std::size_t nnz, std::size_t bytes,
                    std::uint64_t n) noexcept,
                   (ip, nnz, bytes, n))
GCOMP_MULTIVERSION(bool, any_inf_bits,
                   (const std::byte* d, std::size_t n, std::size_t bytes,
                    std::uint32_t inf) noexcept,
                   (d, n, bytes, inf))

GCOMP_MULTIVERSION(bool, encode_f32,
                   (const float* x, const float* e, std::size_t n, std::byte* out,
                    float* e_new) noexcept,
                   (x, e, n, out, e_new))
GCOMP_MULTIVERSION(bool, encode_bf16,
                   (const float* x, const float* e, std::size_t n, std::byte* out,
                    float* e_new) noexcept,
                   (x, e, n, out, e_new))
GCOMP_MULTIVERSION(void, add_scaled_f32,
                   (float* acc, const std::byte* v, float alpha, std::size_t n) noexcept,
                   (acc, v, alpha, n))
GCOMP_MULTIVERSION(void, add_scaled_bf16,
                   (float* acc, const std::byte* v, float alpha, std::size_t n) noexcept,
                   (acc, v, alpha, n))

bool encode_half(const float* x, const float* e, std::size_t n, std::byte* out,
                 float* e_new) noexcept {
#if GCOMP_X86
  switch (simd_level()) {
    case SimdLevel::avx512:
      return encode_half_avx512(x, e, n, out, e_new);
    case SimdLevel::avx2:
      return encode_half_avx2(x, e, n, out, e_new);
    default:
      break;
  }
#endif
  return encode_half_body(x, e, n, out, e_new);
}

std::size_t positions_at_least(const std::uint32_t* keys, std::size_t n, std::uint32_t t,
                               std::uint32_t* pos) noexcept {
#if GCOMP_X86
  if (simd_level() == SimdLevel::avx512) return positions_at_least_avx512(keys, n, t, pos);
  if (simd_level() == SimdLevel::avx2) return positions_at_least_avx2(keys, n, t, pos);
#endif
  return positions_at_least_body(keys, n, t, pos);
}

void add_scaled_half(float* acc, const std::byte* v, float alpha, std::size_t n) noexcept {
#if GCOMP_X86
  switch (simd_level()) {
    case SimdLevel::avx512:
      return add_scaled_half_avx512(acc, v, alpha, n);
    case SimdLevel::avx2:
      return add_scaled_half_avx2(acc, v, alpha, n);
    default:
      break;
  }
#endif
  add_scaled_half_body(acc, v, alpha, n);
}

}  // namespace gcomp::detail
