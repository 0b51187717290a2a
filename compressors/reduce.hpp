// The canonical order of every floating-point sum a codec puts on the wire (TernGrad's mean and
// deviation, the sign codec's mean |x|, QSGD's bucket norms), fixed so that the CPU with or
// without SIMD, with any thread count, and the CUDA kernels all produce the same bytes:
//
//   * a run of values (a block of kReduceBlock elements, or one QSGD bucket) is summed in 16
//     double lanes: lane j accumulates the values at offsets j, j+16, j+32, ... in that order;
//     the lanes are folded lane[j] += lane[j+w] for w = 8, 4, 2, 1; lane 0 is the sum;
//   * block sums are folded pairwise level by level: s[j] = s[2j] + s[2j+1], an odd last one
//     moving up unchanged, until one is left.
//
// Summing float values in double keeps squares exact (no overflow or underflow for any float)
// and makes the order the only thing left to agree on.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gcomp::detail {

inline constexpr std::size_t kReduceBlock = 4096;

// Folds 16 lanes as above.
inline double fold16(double lane[16]) noexcept {
  for (int w = 8; w >= 1; w /= 2) {
    for (int j = 0; j < w; ++j) lane[j] += lane[j + w];
  }
  return lane[0];
}

// Sum of f(x[i]) over [0, len) in the canonical lane order (the scalar reference).
template <class F>
inline double lane_sum(const float* x, std::size_t len, F f) noexcept {
  double lane[16] = {};
  for (std::size_t i = 0; i < len; ++i) lane[i & 15] += f(x[i]);
  return fold16(lane);
}

// Pairwise fold of count partial sums, in place; returns the total (0 for count == 0).
inline double tree_sum(double* s, std::size_t count) noexcept {
  if (count == 0) return 0.0;
  while (count > 1) {
    const std::size_t half = count / 2;
    for (std::size_t j = 0; j < half; ++j) s[j] = s[2 * j] + s[2 * j + 1];
    if (count & 1) s[half] = s[count - 1];
    count = half + (count & 1);
  }
  return s[0];
}

}  // namespace gcomp::detail
