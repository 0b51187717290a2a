// Top-k, random-k and threshold select exactly what their definitions say: compared with a brute
// force over the same input, on the sampled fast path and on the exact radix path.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "bytes.hpp"
#include "index_pack.hpp"
#include "kernels.hpp"
#include "nonfinite.hpp"
#include "select.hpp"
#include "simd.hpp"
#include "test_util.hpp"

namespace gcomp {
namespace {

struct Sparse {
  std::vector<std::uint64_t> idx;
  std::vector<float> val;
};

// Reads a sparse payload with fp32 values through inspect() and the documented layout (the
// indices packed as gaps: unpack_indices, which the format defines).
Sparse read_sparse(const std::vector<std::byte>& p) {
  const PayloadInfo info = inspect(p);
  Sparse s;
  const std::size_t nnz = info.sections[1] / 4;  // fp32 values
  const std::byte* ip = p.data() + info.header_bytes;
  const std::byte* vp = ip + info.sections[0];
  s.idx.resize(nnz);
  detail::unpack_indices({ip, info.sections[0]}, nnz, info.elements, s.idx.data());
  for (std::size_t j = 0; j < nnz; ++j) s.val.push_back(detail::load_le<float>(vp + 4 * j));
  return s;
}

std::vector<std::uint64_t> brute_topk(const std::vector<float>& x, std::size_t k) {
  std::vector<std::uint64_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::uint64_t a, std::uint64_t b) {
    return std::fabs(x[a]) > std::fabs(x[b]);
  });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

void expect_topk(const std::vector<float>& x, const std::string& spec) {
  const Codec c(spec);
  const Sparse s = read_sparse(c.encode(x, 0));
  const auto want = brute_topk(x, c.selected(x.size()));
  ASSERT_EQ(s.idx, want) << spec << " n=" << x.size();
  for (std::size_t j = 0; j < s.idx.size(); ++j) ASSERT_EQ(s.val[j], x[s.idx[j]]);
}

struct AbsSource {
  const float* x;
  bool first(std::size_t b, std::size_t e, std::uint32_t* k) const {
    again(b, e, k);
    return false;
  }
  void again(std::size_t b, std::size_t e, std::uint32_t* k) const {
    for (std::size_t i = b; i < e; ++i) k[i - b] = detail::abs_bits(x[i]);
  }
  std::uint32_t at(std::size_t i) const { return detail::abs_bits(x[i]); }
};

detail::SelectResult select(const std::vector<float>& x, std::size_t k) {
  AbsSource src{x.data()};
  std::vector<std::uint64_t> out;
  const auto r = detail::select_top(src, x.size(), k, out);
  EXPECT_EQ(out, brute_topk(x, k));
  return r;
}

TEST(TopK, ExactOnRandomData) {
  for (std::size_t n : {1u, 2u, 17u, 1000u, 65537u, 300001u}) {
    const auto x = test::normal(n, static_cast<std::uint32_t>(n));
    for (const char* spec : {"topk:ratio=0.01", "topk:ratio=0.1", "topk:ratio=0.5", "topk:k=1",
                             "topk:k=3", "topk:ratio=1"}) {
      expect_topk(x, spec);
    }
  }
}

TEST(TopK, TiesGoToTheLowerIndex) {
  // Only four magnitudes, both signs: almost every selection ends in a tie.
  std::vector<float> x(50000);
  for (std::size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<float>((i * 7919) % 4) * ((i % 3) ? 1.0f : -1.0f);
  }
  for (std::size_t k : {1u, 10u, 12499u, 12500u, 12501u, 30000u}) {
    expect_topk(x, "topk:k=" + std::to_string(k));
  }
  std::vector<float> same(1000, 0.5f);
  const Sparse s = read_sparse(Codec("topk:k=10").encode(same, 0));
  EXPECT_EQ(s.idx, (std::vector<std::uint64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
}

TEST(TopK, ExactPathWhenTheSampleMisleads) {
  // The strided sample reads x[j * n / 8192] = x[16j]: make those tiny and the rest large, so the
  // estimated bound admits too many candidates and the radix path has to run.
  const std::size_t n = 8192 * 16;
  auto x = test::normal(n, 3);
  for (std::size_t j = 0; j < 8192; ++j) x[16 * j] = 1e-30f * static_cast<float>(j);
  expect_topk(x, "topk:ratio=0.01");
  EXPECT_FALSE(select(x, 1311).fast_path);
  // And the opposite: the sampled positions are the largest, so too few candidates pass.
  auto y = test::normal(n, 4);
  for (std::size_t j = 0; j < 8192; ++j) y[16 * j] = 100.0f + static_cast<float>(j);
  expect_topk(y, "topk:ratio=0.3");
  EXPECT_FALSE(select(y, 39322).fast_path);
  EXPECT_TRUE(select(test::normal(n, 5), 1311).fast_path);
  // Tiny denormals and negative zeros order like their magnitudes.
  std::vector<float> z = {-0.0f, 1e-45f, -1e-44f, 0.0f, 2e-45f, -0.0f};
  expect_topk(z, "topk:k=2");
}

TEST(RandomK, DistinctSortedSeededAndValueIndependent) {
  const std::size_t n = 100003;
  const auto x = test::normal(n, 5);
  const Codec c("randomk:ratio=0.01");
  const Sparse a = read_sparse(c.encode(x, 11));
  ASSERT_EQ(a.idx.size(), c.selected(n));
  EXPECT_TRUE(std::is_sorted(a.idx.begin(), a.idx.end()));
  EXPECT_EQ(std::set<std::uint64_t>(a.idx.begin(), a.idx.end()).size(), a.idx.size());
  for (std::size_t j = 0; j < a.idx.size(); ++j) EXPECT_EQ(a.val[j], x[a.idx[j]]);
  // Same seed: same indices, whatever the values (so ranks sharing a seed send the same set).
  const auto y = test::normal(n, 6);
  EXPECT_EQ(read_sparse(c.encode(y, 11)).idx, a.idx);
  const Sparse b = read_sparse(c.encode(x, 12));
  EXPECT_NE(b.idx, a.idx);
  // scale=true multiplies by n/k.
  const Codec cs("randomk:ratio=0.01,scale=true");
  const Sparse s = read_sparse(cs.encode(x, 11));
  EXPECT_EQ(s.idx, a.idx);
  const float mul = static_cast<float>(static_cast<double>(n) / static_cast<double>(a.idx.size()));
  for (std::size_t j = 0; j < s.idx.size(); ++j) EXPECT_EQ(s.val[j], x[s.idx[j]] * mul);
}

TEST(Threshold, SelectsEveryMagnitudeAtOrAboveTau) {
  auto x = test::normal(70001, 8);
  x[5] = 1.5f;
  x[6] = -1.5f;
  x[7] = std::nextafter(1.5f, 0.0f);
  const Sparse s = read_sparse(Codec("threshold:tau=1.5").encode(x, 0));
  std::vector<std::uint64_t> want;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (std::fabs(x[i]) >= 1.5f) want.push_back(i);
  }
  EXPECT_EQ(s.idx, want);
  EXPECT_EQ(s.idx[0], 5u);
  EXPECT_EQ(s.idx[1], 6u);
  EXPECT_EQ(read_sparse(Codec("threshold:tau=0").encode(x, 0)).idx.size(), x.size());
  EXPECT_TRUE(read_sparse(Codec("threshold:tau=100").encode(x, 0)).idx.empty());
}

// The candidate filter of the selection, at every SIMD level this CPU runs: the positions of the
// keys >= t, in order, compared unsigned (random-k's keys use the top bit), for every length
// around the vector widths and thresholds that pass none, some, or all.
TEST(PositionsAtLeast, EveryLevelFindsWhatTheLoopFinds) {
  using detail::SimdLevel;
  detail::set_simd_level(SimdLevel::avx512);
  const SimdLevel best = detail::simd_level();
  std::vector<std::uint32_t> keys(detail::kKeyBlock);
  std::uint64_t s = 12345;
  for (auto& k : keys) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    k = static_cast<std::uint32_t>(s >> 32);
  }
  keys[5] = 0x80000000u;  // exactly t below, and a high-bit key
  for (const std::uint32_t t : {0u, 1u, 0x40000000u, 0x80000000u, 0xF0000000u, 0xFFFFFFF0u,
                                0xFFFFFFFFu}) {
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{8},
                          std::size_t{9}, std::size_t{31}, std::size_t{33}, std::size_t{100},
                          detail::kKeyBlock}) {
      std::vector<std::uint32_t> want;
      for (std::size_t i = 0; i < n; ++i) {
        if (keys[i] >= t) want.push_back(static_cast<std::uint32_t>(i));
      }
      for (SimdLevel level : {SimdLevel::baseline, SimdLevel::avx2, SimdLevel::avx512}) {
        if (level > best) continue;
        detail::set_simd_level(level);
        std::vector<std::uint32_t> pos(detail::kKeyBlock + 16, 0xDEADBEEFu);
        const std::size_t m = detail::positions_at_least(keys.data(), n, t, pos.data());
        pos.resize(m);
        EXPECT_EQ(pos, want) << "t=" << t << " n=" << n << " level "
                             << detail::simd_level_name(level);
      }
    }
  }
  detail::set_simd_level(SimdLevel::avx512);
}

// The finite check that also finds the largest |x + e| (what the uncompressed path sends, whose
// agreed maximum spares the check of the sum): at every SIMD level, over several chunks, the
// largest magnitude wherever it is and whatever its sign, the copy x + e exact, and NaN/Inf (in x
// or in x + e only) rejected with the first bad element named.
TEST(Magnitude, EveryLevelFindsTheLargestAndTheFirstBad) {
  using detail::SimdLevel;
  const auto status_of = [](auto f) {
    try {
      f();
    } catch (const Error& err) {
      return err.code();
    }
    return Status::ok;
  };
  detail::set_simd_level(SimdLevel::avx512);
  const SimdLevel best = detail::simd_level();
  for (SimdLevel level : {SimdLevel::baseline, SimdLevel::avx2, SimdLevel::avx512}) {
    if (level > best) continue;
    detail::set_simd_level(level);
    const std::string at(detail::simd_level_name(level));
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{9}, std::size_t{33},
                          std::size_t{200003}}) {
      std::vector<float> x = test::normal(n, 7);
      const std::vector<float> e = test::normal(n, 8, 0.25f);
      float want_x = 0, want_sum = 0;
      if (n > 0) {
        x[n - 1 - n / 3] = -1e30f;  // the largest |x| is a negative value in a middle chunk
        for (std::size_t i = 0; i < n; ++i) {
          want_x = std::max(want_x, std::fabs(x[i]));
          want_sum = std::max(want_sum, std::fabs(x[i] + e[i]));
        }
      }
      EXPECT_EQ(detail::checked_magnitude(x, {}), want_x) << at << " n=" << n;
      EXPECT_EQ(detail::checked_magnitude(x, e), want_sum) << at << " n=" << n;
      std::vector<float> out(n, -1.0f);
      EXPECT_EQ(detail::copy_checked_magnitude(x, e, out), want_sum) << at << " n=" << n;
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], x[i] + e[i]) << at << " " << i;
      if (n < 33) continue;
      for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                        -std::numeric_limits<float>::infinity()}) {
        std::vector<float> y = x;
        y[n - 2] = bad;
        y[n / 2 + 1] = bad;  // the first of the two is named
        const std::string named = "element " + std::to_string(n / 2 + 1) + " ";
        for (int form = 0; form < 3; ++form) {
          try {
            if (form == 0) detail::checked_magnitude(y, {});
            if (form == 1) detail::checked_magnitude(y, e);
            if (form == 2) detail::copy_checked_magnitude(y, e, out);
            ADD_FAILURE() << at << " form " << form << " accepted " << bad;
          } catch (const Error& err) {
            EXPECT_EQ(err.code(), Status::nonfinite);
            EXPECT_NE(std::string(err.what()).find(named), std::string::npos) << err.what();
          }
        }
      }
      // Finite x and e whose sum overflows: only the forms with the residual see it.
      std::vector<float> big = x, push(n, 0.0f);
      big[3] = 3e38f;
      push[3] = 3e38f;
      EXPECT_EQ(detail::checked_magnitude(big, {}), 3e38f) << at;
      EXPECT_EQ(status_of([&] { detail::checked_magnitude(big, push); }), Status::nonfinite) << at;
      EXPECT_EQ(status_of([&] { detail::copy_checked_magnitude(big, push, out); }),
                Status::nonfinite)
          << at;
    }
  }
  detail::set_simd_level(SimdLevel::avx512);
}

}  // namespace
}  // namespace gcomp
