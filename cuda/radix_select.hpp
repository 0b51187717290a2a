// The radix select's two decisions as functions of a few counts, shared by its one-block scans
// (cuda/sparse.cu) and a host test (tests/cuda/radix_select_test.cpp) that checks them against
// the one-at-a-time walks they replace: which histogram bin holds the need-th largest key, and
// which run of tie counts holds the need-th tie; and how many ties each tile gives the
// selection once the cut is known. And the sample that top-k's threshold comes from.
#pragma once

#include <cmath>
#include <cstddef>

#include "host_device.hpp"

namespace gcomp::cuda::detail {

// A walk down the bins from the top (bins - 1) takes each bin whole while it holds fewer keys
// than are still needed, and stops at the bin that holds the need-th key, or at bin 0. Bin c,
// with `above` keys in the bins above it and `count` of its own, is where the walk stops when
// the walk reaches it (c is the top bin, or the bins above hold fewer than need) and it holds
// the rest (or c is bin 0). Exactly one bin satisfies this for any counts and need.
GCOMP_HOST_DEVICE inline bool walk_stops_at(int c, int bins, unsigned long long above,
                                            unsigned long long count, unsigned long long need) {
  return (c == bins - 1 || above < need) && (c == 0 || need <= above + count);
}

// Runs of tie counts in index order: the run with `before` ties ahead of it and `count` of its
// own holds the need-th tie (need >= 1; one run does when the runs hold at least need).
GCOMP_HOST_DEVICE inline bool holds_nth(unsigned long long before, unsigned long long count,
                                        unsigned long long need) {
  return before < need && need <= before + count;
}

// The ties (keys equal to T) that tile `tile` contributes to the selection, of the `ties` it
// holds: all of them before the tile of the cut (and everywhere when nothing is cut, cut_tile
// ~0), in the cut's tile the cut's rank among its ties (the ties at or below the cut's index),
// none after it.
GCOMP_HOST_DEVICE inline unsigned long long ties_taken(unsigned long long tile,
                                                       unsigned long long ties,
                                                       unsigned long long cut_tile,
                                                       unsigned long long cut_rank) {
  if (cut_tile == ~0ull || tile < cut_tile) return ties;
  return tile == cut_tile ? cut_rank : 0;
}

// Top-k's sample: element s of m (s < m <= n) is the middle of the s-th of m equal stretches
// of [0, n), so the positions are strictly increasing and below n (exact while 2 m n < 2^64: with
// m <= 2^18, n < 2^45).
GCOMP_HOST_DEVICE inline std::size_t sample_index(std::size_t s, std::size_t n, std::size_t m) {
  return static_cast<std::size_t>(((2 * static_cast<unsigned long long>(s) + 1) * n) / (2 * m));
}

// The rank r in a sample of m of n elements whose key is the threshold: the k-th largest key of
// the n is at or above the sample's r-th largest key unless the sample holds r or more of the
// k - 1 largest. That count is about Binomial(m, k / n), of mean mu = k m / n; r is 5 standard
// deviations (sqrt(mu)) and 5 past its mean, so a sample as good as a random one misses with a
// probability below 1e-6 (a miss costs time, not exactness: the select then reads the whole
// tensor), while the elements at or above the threshold are about k (1 + 5 / sqrt(mu)). 0 when
// no rank fits in the sample.
inline std::size_t sample_rank(std::size_t k, std::size_t n, std::size_t m) {
  if (n == 0 || m == 0 || k == 0) return 0;
  const double mu = static_cast<double>(k) * static_cast<double>(m) / static_cast<double>(n);
  const double r = std::ceil(mu + 5.0 * std::sqrt(mu) + 5.0);
  return r <= static_cast<double>(m) ? static_cast<std::size_t>(r) : 0;
}

}  // namespace gcomp::cuda::detail
