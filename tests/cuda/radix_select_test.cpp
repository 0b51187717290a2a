// The radix select's decisions (cuda/radix_select.hpp) as the one-block scans of cuda/sparse.cu
// apply them, against the one-at-a-time walks they replaced, on the host: they run without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "radix_select.hpp"

namespace {

using gcomp::cuda::detail::holds_nth;
using gcomp::cuda::detail::sample_index;
using gcomp::cuda::detail::sample_rank;
using gcomp::cuda::detail::ties_taken;
using gcomp::cuda::detail::walk_stops_at;
using Counts = std::vector<unsigned long long>;

struct Stop {
  int bin;
  unsigned long long left;  // keys still needed from that bin
};

// The walk as the one-thread kernel did it.
Stop walk(const Counts& hist, unsigned long long need) {
  int bin = static_cast<int>(hist.size()) - 1;
  while (bin > 0 && hist[bin] < need) {
    need -= hist[bin];
    --bin;
  }
  return {bin, need};
}

// Every bin's test with the sums of the bins above it, as the scan gives them; exactly one stops.
Stop scanned(const Counts& hist, unsigned long long need) {
  const int bins = static_cast<int>(hist.size());
  Stop found{-1, 0};
  int stops = 0;
  unsigned long long above = 0;
  for (int c = bins - 1; c >= 0; --c) {
    if (walk_stops_at(c, bins, above, hist[c], need)) {
      found = {c, need - above};
      ++stops;
    }
    above += hist[c];
  }
  EXPECT_EQ(stops, 1) << "need " << need;
  return found;
}

// Histograms as gradients give them (a few crowded bins among empty ones), uniform ones, empty
// ones; every need from 0 to past the total.
TEST(RadixSelect, TheScanStopsAtTheWalksBin) {
  std::mt19937_64 rng(7);
  for (int bins : {2048, 1024, 4, 1}) {
    for (int shape = 0; shape < 4; ++shape) {
      Counts hist(bins, 0);
      for (auto& h : hist) {
        if (shape == 0) h = rng() % 5 == 0 ? rng() % 1000 : 0;
        if (shape == 1) h = rng() % 3;
        if (shape == 2) h = 0;
        if (shape == 3) h = rng() % 64 == 0 ? 1 : 0;
      }
      unsigned long long total = 0;
      for (auto h : hist) total += h;
      const unsigned long long step = total > 5000 ? total / 4999 : 1;
      for (unsigned long long need = 0; need <= total + 3; need += step) {
        const Stop w = walk(hist, need);
        const Stop s = scanned(hist, need);
        ASSERT_EQ(s.bin, w.bin) << "bins " << bins << " shape " << shape << " need " << need;
        ASSERT_EQ(s.left, w.left) << "bins " << bins << " shape " << shape << " need " << need;
      }
    }
  }
}

// The tie cut: tiles' tie counts summed in runs (one run per thread), the run that holds the
// need-th tie, then its tiles one by one: the same tile and rank within it as walking every tile.
TEST(RadixSelect, TheRunsFindTheWalksTile) {
  std::mt19937_64 rng(11);
  for (std::size_t tiles : {std::size_t{1}, std::size_t{5}, std::size_t{1023}, std::size_t{1025},
                            std::size_t{65536}}) {
    Counts counts(tiles);
    for (auto& c : counts) c = rng() % 7 == 0 ? rng() % 4 : 0;
    counts[rng() % tiles] += 1;  // at least one tie
    unsigned long long total = 0;
    for (auto c : counts) total += c;
    const std::size_t threads = 1024;
    const std::size_t per = (tiles + threads - 1) / threads;
    for (unsigned long long need = 1; need <= total; need += 1 + total / 300) {
      std::size_t walk_tile = 0;
      unsigned long long walk_left = need;
      while (counts[walk_tile] < walk_left) walk_left -= counts[walk_tile++];
      int runs = 0;
      unsigned long long before = 0;
      for (std::size_t t = 0; t < threads; ++t) {
        const std::size_t lo = t * per < tiles ? t * per : tiles;
        const std::size_t hi = lo + per < tiles ? lo + per : tiles;
        unsigned long long mine = 0;
        for (std::size_t i = lo; i < hi; ++i) mine += counts[i];
        if (holds_nth(before, mine, need)) {
          ++runs;
          unsigned long long left = need - before;
          std::size_t tile = lo;
          while (counts[tile] < left) left -= counts[tile++];
          EXPECT_EQ(tile, walk_tile) << "tiles " << tiles << " need " << need;
          EXPECT_EQ(left, walk_left) << "tiles " << tiles << " need " << need;
        }
        before += mine;
      }
      ASSERT_EQ(runs, 1) << "tiles " << tiles << " need " << need;
    }
  }
}

// Ties scattered over tiles; for every need, the cut is the need-th tie in index order: each
// tile gives the ties at or below the cut's index, and no more than need in all.
TEST(RadixSelect, EachTileGivesTheTiesUpToTheCut) {
  std::mt19937_64 rng(13);
  constexpr std::size_t kTile = 16;
  for (std::size_t n : {std::size_t{1}, std::size_t{40}, std::size_t{1000}}) {
    std::vector<bool> tie(n);
    for (std::size_t i = 0; i < n; ++i) tie[i] = rng() % 3 == 0;
    tie[rng() % n] = true;
    std::vector<std::size_t> where;
    for (std::size_t i = 0; i < n; ++i) {
      if (tie[i]) where.push_back(i);
    }
    const std::size_t tiles = (n + kTile - 1) / kTile;
    Counts per(tiles);
    for (std::size_t i : where) ++per[i / kTile];
    for (std::size_t need = 1; need <= where.size(); ++need) {
      const std::size_t cut = where[need - 1];
      const unsigned long long cut_tile = cut / kTile;
      unsigned long long cut_rank = 0;  // ties in the cut's tile up to and with it
      for (std::size_t i = cut_tile * kTile; i <= cut; ++i) cut_rank += tie[i] ? 1 : 0;
      unsigned long long total = 0;
      for (std::size_t t = 0; t < tiles; ++t) {
        unsigned long long want = 0;
        for (std::size_t i = t * kTile; i < std::min(n, (t + 1) * kTile) && i <= cut; ++i) {
          want += tie[i] ? 1 : 0;
        }
        const unsigned long long got = ties_taken(t, per[t], cut_tile, cut_rank);
        EXPECT_EQ(got, want) << "n " << n << " need " << need << " tile " << t;
        total += got;
      }
      EXPECT_EQ(total, need) << "n " << n;
    }
    // Nothing cut (every tie taken): each tile gives all of its ties.
    for (std::size_t t = 0; t < tiles; ++t) EXPECT_EQ(ties_taken(t, per[t], ~0ull, 0), per[t]);
  }
}

// Top-k's sample: m positions, strictly increasing, all below n, the first in the first
// stretch and the last in the last.
TEST(TopkSample, PositionsAreIncreasingAndInRange) {
  for (std::size_t n : {std::size_t{1} << 20, (std::size_t{1} << 20) + 3, std::size_t{3000017},
                        std::size_t{1} << 28, (std::size_t{1} << 33) + 5}) {
    for (std::size_t m : {std::size_t{1}, std::size_t{1} << 17, std::size_t{1} << 18,
                          std::min(n / 8, std::size_t{1} << 18)}) {
      std::size_t prev = sample_index(0, n, m);
      EXPECT_LT(prev, (n + m - 1) / m) << n << " " << m;
      for (std::size_t s = 1; s < m; ++s) {
        const std::size_t i = sample_index(s, n, m);
        ASSERT_GT(i, prev) << "n " << n << " m " << m << " s " << s;
        prev = i;
      }
      EXPECT_LT(prev, n);
      EXPECT_GE(prev, n - (n + m - 1) / m) << n << " " << m;
    }
  }
}

// The rank is past the sample's expected count of the top k by five of its deviations, and no
// rank fits when that passes the sample's size.
TEST(TopkSample, TheRankIsFiveDeviationsPastTheMean) {
  const std::size_t n = std::size_t{1} << 28;
  const std::size_t m = std::size_t{1} << 18;
  for (std::size_t k : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, n / 1000, n / 100,
                        n / 8, n / 2, n - 1}) {
    const double mu = static_cast<double>(k) * m / n;
    const std::size_t r = sample_rank(k, n, m);
    if (mu + 5 * std::sqrt(mu) + 5 > static_cast<double>(m)) {
      EXPECT_EQ(r, 0u) << k;
      continue;
    }
    EXPECT_GE(static_cast<double>(r), mu + 5 * std::sqrt(mu) + 5) << k;
    EXPECT_LT(static_cast<double>(r), mu + 5 * std::sqrt(mu) + 6) << k;
  }
  EXPECT_EQ(sample_rank(0, n, m), 0u);
  EXPECT_EQ(sample_rank(5, 0, 0), 0u);
}

// The device's threshold on the host: the rank-th largest key of the sample. On tensors shaped
// as gradients (normal, and layers of scales a thousand apart) it keeps at least k elements, and
// at most what the rank's own spread allows: the count above the sample's r-th largest key is
// about r n / m, give or take sqrt(r) n / m; five of those is the bound.
TEST(TopkSample, TheThresholdKeepsAtLeastKAndAboutK) {
  const std::size_t n = std::size_t{1} << 22;
  const std::size_t m = std::min(std::size_t{1} << 18, n / 8);
  std::mt19937 g(5);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> normal(n), layers(n);
  for (std::size_t i = 0; i < n; ++i) {
    normal[i] = d(g);
    layers[i] = d(g) * std::pow(10.0f, static_cast<float>((i >> 16) % 4) - 2.0f);
  }
  for (const std::vector<float>* x : {&normal, &layers}) {
    std::vector<float> keys(n);
    for (std::size_t i = 0; i < n; ++i) keys[i] = std::fabs((*x)[i]);
    for (double ratio : {0.1, 0.01, 0.001}) {
      const std::size_t k = static_cast<std::size_t>(ratio * n);
      const std::size_t r = sample_rank(k, n, m);
      ASSERT_GT(r, 0u);
      std::vector<float> sample(m);
      for (std::size_t s = 0; s < m; ++s) sample[s] = keys[sample_index(s, n, m)];
      std::sort(sample.begin(), sample.end());
      const float t = sample[m - r];
      const std::size_t kept =
          static_cast<std::size_t>(std::count_if(keys.begin(), keys.end(), [t](float v) { return v >= t; }));
      const double per = static_cast<double>(n) / m;
      EXPECT_GE(kept, k) << ratio << (x == &layers ? " layers" : " normal");
      EXPECT_LE(static_cast<double>(kept), per * (r + 5 * std::sqrt(static_cast<double>(r))))
          << ratio << (x == &layers ? " layers" : " normal");
    }
  }
}

}  // namespace
