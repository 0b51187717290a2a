// Compact sparse indices (compressors/index_pack.hpp): round trips at every width, the size a
// top-k selection packs to, and every malformed stream rejected.
#include "index_pack.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gcomp/error.hpp"

namespace gcomp::detail {
namespace {

std::vector<std::byte> packed(const std::vector<std::uint64_t>& idx, std::uint64_t n) {
  std::vector<std::byte> out(packed_indices_bound(idx.size(), n));
  out.resize(pack_indices(idx.data(), idx.size(), out.data()));
  return out;
}

std::vector<std::uint64_t> unpacked(const std::vector<std::byte>& bytes, std::uint64_t count,
                                    std::uint64_t n) {
  std::vector<std::uint64_t> out(count);
  unpack_indices(bytes, count, n, out.data());
  return out;
}

// k distinct indices below n, sorted.
std::vector<std::uint64_t> draw(std::uint64_t n, std::size_t k, std::uint32_t seed) {
  std::mt19937_64 g(seed);
  std::vector<std::uint64_t> idx;
  while (idx.size() < k) {
    for (std::size_t j = idx.size(); j < k; ++j) idx.push_back(g() % n);
    std::sort(idx.begin(), idx.end());
    idx.erase(std::unique(idx.begin(), idx.end()), idx.end());
  }
  return idx;
}

TEST(IndexPack, RoundTrips) {
  const std::uint64_t big = std::uint64_t{1} << 40;
  for (std::uint64_t n : {std::uint64_t{1}, std::uint64_t{5}, std::uint64_t{1000},
                          std::uint64_t{1} << 24, big}) {
    for (std::size_t k : {0u, 1u, 127u, 128u, 129u, 1000u}) {
      if (k > n) continue;
      const auto idx = draw(n, k, static_cast<std::uint32_t>(n + k));
      const auto bytes = packed(idx, n);
      EXPECT_LE(bytes.size(), packed_indices_bound(k, n));
      EXPECT_EQ(unpacked(bytes, k, n), idx) << "n=" << n << " k=" << k;
    }
  }
  // Every index of a small tensor (all gaps zero: width 0), the extremes, and a 64-bit gap.
  std::vector<std::uint64_t> all(300);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
  EXPECT_EQ(packed(all, 300).size(), 3u);  // three blocks of width 0
  EXPECT_EQ(unpacked(packed(all, 300), 300, 300), all);
  const std::uint64_t top = ~std::uint64_t{0};
  const std::vector<std::uint64_t> ends = {0, top - 1};
  EXPECT_EQ(unpacked(packed(ends, top), 2, top), ends);
  const std::vector<std::uint64_t> far = {top - 1};  // gap 2^64 - 2: width 64
  EXPECT_EQ(static_cast<unsigned>(packed(far, top)[0]), 64u);
  EXPECT_EQ(unpacked(packed(far, top), 1, top), far);
}

// A uniformly random 1% of 16M (what top-k of i.i.d. values selects): gaps are geometric with
// p = 0.01, and a block of 128 takes the width of its largest. P(all 128 gaps < 2^w) =
// (1 - 0.99^(2^w))^128 is 0.47 for w = 9 and 0.996 for w = 10, so E[w] = 9.53 bits: 9.53 / 8 + 1
// / 128 = 1.199 bytes an index (the entropy of such a subset is 8.08 bits, 1.01 bytes, the
// least any code can take).
TEST(IndexPack, OnePercentOf16MTakesWhatItsGapsNeed) {
  const std::uint64_t n = std::uint64_t{1} << 24;
  const auto idx = draw(n, n / 100, 7);
  const double per = static_cast<double>(packed(idx, n).size()) / static_cast<double>(idx.size());
  EXPECT_NEAR(per, 1.199, 0.02);
}

// The cost model's figure (expected_packed_index_bytes) against packed random supports at four
// densities. A block's width takes two or three adjacent values at these densities, so its
// standard deviation is under 1 bit; over B blocks the mean bytes an index is within
// 5 / (8 sqrt(B)) of the expectation but for a 5-sigma event (B >= 780 here: 0.022 at most).
TEST(IndexPack, TheModelsExpectationMatchesPackedSupports) {
  const std::uint64_t n = std::uint64_t{1} << 24;
  for (const double d : {0.1, 0.01, 0.001, 0.0001}) {
    const auto k = static_cast<std::size_t>(std::max(100000.0, d * static_cast<double>(n)));
    const std::uint64_t range = static_cast<std::uint64_t>(static_cast<double>(k) / d);
    const auto idx = draw(range, k, 11);
    const double per = static_cast<double>(packed(idx, range).size()) / static_cast<double>(k);
    const double blocks = static_cast<double>(k) / kIndexBlock;
    EXPECT_NEAR(per, expected_packed_index_bytes(d), 5.0 / (8.0 * std::sqrt(blocks)))
        << "density " << d;
  }
  EXPECT_NEAR(expected_packed_index_bytes(0.01), 1.199, 0.001);
  EXPECT_DOUBLE_EQ(expected_packed_index_bytes(1.0), 1.0 / kIndexBlock);  // gaps all 0
}

TEST(IndexPack, RejectsMalformedStreams) {
  const std::uint64_t n = 100000;
  const auto idx = draw(n, 300, 3);
  const auto good = packed(idx, n);
  const auto rejects = [&](std::vector<std::byte> bytes, std::uint64_t count, std::uint64_t nn) {
    std::vector<std::uint64_t> out(count);
    try {
      unpack_indices(bytes, count, nn, out.data());
    } catch (const Error& e) {
      return e.code() == Status::bad_payload;
    }
    return false;
  };
  EXPECT_FALSE(rejects(good, 300, n));
  auto wide = good;
  wide[0] = std::byte{65};
  EXPECT_TRUE(rejects(wide, 300, n));
  EXPECT_TRUE(rejects(std::vector<std::byte>(good.begin(), good.end() - 1), 300, n));  // short
  auto longer = good;
  longer.push_back(std::byte{0});
  EXPECT_TRUE(rejects(longer, 300, n));                      // trailing bytes
  EXPECT_TRUE(rejects(good, 301, n));                        // more indices than written
  EXPECT_TRUE(rejects(good, 300, idx.back()));               // the last index at n
  EXPECT_TRUE(rejects({}, 1, n));                            // nothing at all
  // A block of 3 gaps of width 5 is 15 bits: the 16th must be zero.
  const std::vector<std::uint64_t> three = {1, 3, 30};
  auto pad = packed(three, 100);
  ASSERT_EQ(pad.size(), 3u);
  pad[2] |= std::byte{0x80};
  EXPECT_TRUE(rejects(pad, 3, 100));
  // An index beyond n through a gap that would overflow 64 bits.
  std::vector<std::byte> overflow = {std::byte{64}};
  for (int i = 0; i < 8; ++i) overflow.push_back(std::byte{0xff});
  EXPECT_TRUE(rejects(overflow, 1, ~std::uint64_t{0}));
}

}  // namespace
}  // namespace gcomp::detail
