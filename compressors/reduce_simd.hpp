// SIMD forms of the canonical 16-lane double sum (reduce.hpp). AVX-512 (Lanes16): one zmm holds
// lanes 0..7 and another lanes 8..15. AVX2 (Lanes16Avx2): four ymm of four lanes each. Either
// way 16 consecutive floats feed one value to each lane, and fold() performs the same
// w = 8, 4, 2, 1 folds as fold16(), so every level's sum has the same bits. Each struct is for
// kernels of its own level only (simd.hpp).
#pragma once

#include <cstdint>

#include "simd.hpp"

#if GCOMP_X86

namespace gcomp::detail {

// Used inside AVX-512 functions only; starts at zero.
struct Lanes16 {
  __m512d lo;
  __m512d hi;
  GCOMP_TARGET_AVX512 Lanes16() : lo(_mm512_setzero_pd()), hi(_mm512_setzero_pd()) {}

  GCOMP_TARGET_AVX512 static __m512d low8(__m512 v) {
    return _mm512_cvtps_pd(_mm512_castps512_ps256(v));
  }
  GCOMP_TARGET_AVX512 static __m512d high8(__m512 v) {
    return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  }
  GCOMP_TARGET_AVX512 void add(__m512 v) {
    lo = _mm512_add_pd(lo, low8(v));
    hi = _mm512_add_pd(hi, high8(v));
  }
  // Squares of floats are exact in double, so a fused multiply-add would give the same sum.
  GCOMP_TARGET_AVX512 void add_squares(__m512 v) {
    const __m512d l = low8(v);
    const __m512d h = high8(v);
    lo = _mm512_add_pd(lo, _mm512_mul_pd(l, l));
    hi = _mm512_add_pd(hi, _mm512_mul_pd(h, h));
  }
  GCOMP_TARGET_AVX512 double fold() const {
    const __m512d s8 = _mm512_add_pd(lo, hi);
    const __m256d s4 = _mm256_add_pd(_mm512_castpd512_pd256(s8), _mm512_extractf64x4_pd(s8, 1));
    const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
  }
};

// 16 floats from p, loaded once. A vector used several times is otherwise often loaded again
// for each use (generic tuning folds the loads into the instructions), which costs the
// memory-bound kernels up to a tenth of their speed.
GCOMP_TARGET_AVX512 inline __m512 load_once(const float* p) {
  __m512 v = _mm512_loadu_ps(p);
  asm("" : "+v"(v));
  return v;
}

GCOMP_TARGET_AVX512 inline __m512 abs_ps(__m512 v) {
  return _mm512_castsi512_ps(
      _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fffffff)));
}

// Used inside AVX2 functions only; starts at zero.
struct Lanes16Avx2 {
  __m256d l0, l1, l2, l3;  // lanes 0..3, 4..7, 8..11, 12..15
  GCOMP_TARGET_AVX2 Lanes16Avx2()
      : l0(_mm256_setzero_pd()),
        l1(_mm256_setzero_pd()),
        l2(_mm256_setzero_pd()),
        l3(_mm256_setzero_pd()) {}

  // a: floats 0..7 of the 16, b: floats 8..15.
  GCOMP_TARGET_AVX2 void add(__m256 a, __m256 b) {
    l0 = _mm256_add_pd(l0, _mm256_cvtps_pd(_mm256_castps256_ps128(a)));
    l1 = _mm256_add_pd(l1, _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1)));
    l2 = _mm256_add_pd(l2, _mm256_cvtps_pd(_mm256_castps256_ps128(b)));
    l3 = _mm256_add_pd(l3, _mm256_cvtps_pd(_mm256_extractf128_ps(b, 1)));
  }
  GCOMP_TARGET_AVX2 static __m256d square(__m128 v) {
    const __m256d d = _mm256_cvtps_pd(v);
    return _mm256_mul_pd(d, d);
  }
  GCOMP_TARGET_AVX2 void add_squares(__m256 a, __m256 b) {
    l0 = _mm256_add_pd(l0, square(_mm256_castps256_ps128(a)));
    l1 = _mm256_add_pd(l1, square(_mm256_extractf128_ps(a, 1)));
    l2 = _mm256_add_pd(l2, square(_mm256_castps256_ps128(b)));
    l3 = _mm256_add_pd(l3, square(_mm256_extractf128_ps(b, 1)));
  }
  GCOMP_TARGET_AVX2 double fold() const {
    const __m256d s4 = _mm256_add_pd(_mm256_add_pd(l0, l2), _mm256_add_pd(l1, l3));
    const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
  }
};

// 8 floats from p, loaded once (see load_once).
GCOMP_TARGET_AVX2 inline __m256 load_once8(const float* p) {
  __m256 v = _mm256_loadu_ps(p);
  asm("" : "+x"(v));
  return v;
}

GCOMP_TARGET_AVX2 inline __m256 abs_ps8(__m256 v) {
  return _mm256_castsi256_ps(
      _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7fffffff)));
}

// The 8 lanes of a compare result as the low 8 bits of an integer (lane 0 lowest).
GCOMP_TARGET_AVX2 inline std::uint32_t mask8(__m256 cmp) {
  return static_cast<std::uint32_t>(_mm256_movemask_ps(cmp));
}

// The lanes whose bit is set in m (8 bits), as an all-ones lane mask.
GCOMP_TARGET_AVX2 inline __m256 lanes_of(std::uint32_t m) {
  const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i v = _mm256_and_si256(_mm256_set1_epi32(static_cast<int>(m)), bit);
  return _mm256_castsi256_ps(_mm256_cmpeq_epi32(v, bit));
}

// 8 16-bit draws (at p) as floats in [0, 1): draw * 2^-16.
GCOMP_TARGET_AVX2 inline __m256 draws8(const std::uint32_t* p) {
  const __m128i d16 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu16_epi32(d16)), _mm256_set1_ps(0x1p-16f));
}

}  // namespace gcomp::detail
#endif
