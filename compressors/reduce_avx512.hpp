// AVX-512 form of the canonical 16-lane double sum (reduce.hpp): one zmm holds lanes 0..7 and
// another lanes 8..15, so adding 16 consecutive floats feeds each value to its own lane, and
// fold() performs the same w = 8, 4, 2, 1 folds as fold16().
#pragma once

#if defined(__AVX512F__)
#include <immintrin.h>

namespace gcomp::detail {

struct Lanes16 {
  __m512d lo = _mm512_setzero_pd();
  __m512d hi = _mm512_setzero_pd();

  static __m512d low8(__m512 v) { return _mm512_cvtps_pd(_mm512_castps512_ps256(v)); }
  static __m512d high8(__m512 v) {
    return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  }
  void add(__m512 v) {
    lo = _mm512_add_pd(lo, low8(v));
    hi = _mm512_add_pd(hi, high8(v));
  }
  // Squares of floats are exact in double, so a fused multiply-add would give the same sum.
  void add_squares(__m512 v) {
    const __m512d l = low8(v);
    const __m512d h = high8(v);
    lo = _mm512_add_pd(lo, _mm512_mul_pd(l, l));
    hi = _mm512_add_pd(hi, _mm512_mul_pd(h, h));
  }
  double fold() const {
    const __m512d s8 = _mm512_add_pd(lo, hi);
    const __m256d s4 = _mm256_add_pd(_mm512_castpd512_pd256(s8), _mm512_extractf64x4_pd(s8, 1));
    const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
  }
};

inline __m512 abs_ps(__m512 v) {
  return _mm512_castsi512_ps(
      _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fffffff)));
}

}  // namespace gcomp::detail
#endif
