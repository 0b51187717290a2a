// AVX-512 form of the canonical 16-lane double sum (reduce.hpp): one zmm holds lanes 0..7 and
// another lanes 8..15, so adding 16 consecutive floats feeds each value to its own lane, and
// fold() performs the same w = 8, 4, 2, 1 folds as fold16(). For AVX-512 kernels only (simd.hpp).
#pragma once

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

}  // namespace gcomp::detail
#endif
