// powersgd's spec and PowerSGD's kernels (compressors/low_rank.hpp) against float64, with the
// bound the header derives: an output element that sums k float64 products of floats (each
// exact) is off by at most 2^-24 |exact| (its rounding to float32) + (k - 1) 2^-53 sum |terms|.
#include "low_rank.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gcomp/codec.hpp"
#include "parallel.hpp"

namespace gcomp {
namespace {

using detail::LowRankSpec;

std::vector<float> normals(std::size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

// The header's bound for one element: exact value e, sum of |terms| a, k terms.
double bound(double e, double a, std::size_t k) {
  return 0x1p-24 * std::fabs(e) + (k - 1) * 0x1p-53 * a * (1 + 1e-12) + 1e-300;
}

TEST(PowerSgdSpec, DefaultsCanonicalFormAndProperties) {
  const Codec c("powersgd");
  EXPECT_EQ(c.kind(), CodecKind::powersgd);
  EXPECT_EQ(c.spec(),
            "powersgd:rank=1,warm_start=true,min_compression_rate=2,values=fp32,alternate=false,"
            "start=0");
  const Codec d(
      "powersgd:rank=4,values=fp16,alternate=true,start=10,warm_start=false,"
      "min_compression_rate=1.5");
  const LowRankSpec& s = detail::low_rank_spec(d);
  EXPECT_EQ(s.rank, 4u);
  EXPECT_TRUE(s.fp16);
  EXPECT_TRUE(s.alternate);
  EXPECT_FALSE(s.warm_start);
  EXPECT_EQ(s.start, 10u);
  EXPECT_EQ(s.min_compression_rate, 1.5);
  EXPECT_EQ(Codec(d.spec()).spec(), d.spec());  // the canonical spec reads back
  const CodecProperties p = d.properties();
  EXPECT_TRUE(p.low_rank);
  EXPECT_TRUE(p.contraction);
  EXPECT_FALSE(p.sparse);
  EXPECT_FALSE(p.unbiased);
  EXPECT_FALSE(Codec("fp16").properties().low_rank);
}

TEST(PowerSgdSpec, BadKeysAndValuesNameTheSpec) {
  for (const char* bad :
       {"powersgd:rank=0", "powersgd:rank=1025", "powersgd:rank=two", "powersgd:values=int8",
        "powersgd:min_compression_rate=0.5", "powersgd:warm_start=maybe", "powersgd:alternate=2",
        "powersgd:start=-1", "powersgd:ratio=0.1", "powersgd:rank=2,rank=3"}) {
    try {
      Codec c(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Status::invalid_argument) << bad;
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

TEST(PowerSgdSpec, HasNoPayload) {
  const Codec c("powersgd:rank=2");
  const std::vector<float> x(100, 1.0f);
  try {
    c.encode(x);
    ADD_FAILURE() << "encode gave a payload";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Status::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("allreduce_buckets"), std::string::npos) << e.what();
  }
  ErrorFeedback ef(100);
  ef.residual()[3] = 2.0f;
  EXPECT_THROW(c.encode_ef(ef, x), Error);
  EXPECT_EQ(ef.residual()[3], 2.0f);  // untouched
  // A payload that claims to be powersgd's is rejected as such.
  std::vector<std::byte> fp16 = Codec("fp16").encode(x);
  fp16[5] = static_cast<std::byte>(CodecKind::powersgd);
  std::vector<float> acc(100, 0.0f);
  EXPECT_THROW(decode_add(fp16, acc), Error);
  for (float v : acc) ASSERT_EQ(v, 0.0f);
}

TEST(PowerSgdSpec, WhichMatricesAreCompressed) {
  LowRankSpec s;
  s.rank = 4;
  s.min_compression_rate = 2;
  EXPECT_EQ(detail::low_rank_of(1000, 1, s), 0u);  // 1-D
  EXPECT_EQ(detail::low_rank_of(1, 1000, s), 0u);
  EXPECT_EQ(detail::low_rank_of(16, 16, s), 4u);  // 256 >= 2 x 32 x 4 = 256: at the rate
  EXPECT_EQ(detail::low_rank_of(15, 16, s), 0u);  // 240 < 2 x 31 x 4 = 248
  EXPECT_EQ(detail::low_rank_of(784, 1024, s), 4u);
  s.min_compression_rate = 200;
  EXPECT_EQ(detail::low_rank_of(784, 1024, s), 0u);  // 802816 < 200 x 1808 x 4
  s.min_compression_rate = 1;
  s.rank = 8;
  EXPECT_EQ(detail::low_rank_of(4, 100, s), 0u);  // 400 < 104 x 4: rank min(8, 4) is 4
  EXPECT_EQ(detail::low_rank_of(20, 100, s), 8u);
}

class Kernels : public ::testing::TestWithParam<std::size_t> {};

TEST_P(Kernels, ProductsWithinTheDerivedBound) {
  const std::size_t r = GetParam(), rows = 67, cols = 45;
  const auto m = normals(rows * cols, 1);
  const auto q = normals(cols * r, 2);
  const auto pin = normals(rows * r, 3);
  std::vector<float> p(rows * r), qt(cols * r);
  std::vector<double> acc(cols * r);
  detail::lr_multiply(m.data(), rows, cols, q.data(), r, p.data());
  detail::lr_multiply_t(m.data(), rows, cols, pin.data(), r, qt.data(), acc.data());
  // got[o][j] against the float64 sum over t of element(o, t) f[t][j], t = 0 .. terms - 1.
  const auto check = [&](const std::vector<float>& got, const std::vector<float>& f,
                         std::size_t outs, std::size_t terms, auto element) {
    for (std::size_t o = 0; o < outs; ++o) {
      for (std::size_t j = 0; j < r; ++j) {
        double e = 0, a = 0;
        for (std::size_t t = 0; t < terms; ++t) {
          e += double(element(o, t)) * f[t * r + j];
          a += std::fabs(double(element(o, t)) * f[t * r + j]);
        }
        ASSERT_LE(std::fabs(got[o * r + j] - e), bound(e, a, terms)) << o << " " << j;
      }
    }
  };
  check(p, q, rows, cols, [&](std::size_t i, std::size_t k) { return m[i * cols + k]; });
  check(qt, pin, cols, rows, [&](std::size_t k, std::size_t i) { return m[i * cols + k]; });
  // The reconstruction: out = a b^T * 2, e = m - float(a b^T / 4).
  std::vector<float> out(rows * cols), res = m;
  std::vector<double> work(cols * r);
  detail::lr_reconstruct(p.data(), qt.data(), rows, cols, r, 2.0, out.data(), 0.25, res.data(),
                         res.data(), work.data());
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t k = 0; k < cols; ++k) {
      double s = 0, a = 0;
      for (std::size_t j = 0; j < r; ++j) {
        s += double(p[i * r + j]) * qt[k * r + j];
        a += std::fabs(double(p[i * r + j]) * qt[k * r + j]);
      }
      const std::size_t at = i * cols + k;
      ASSERT_LE(std::fabs(out[at] - 2 * s), 2 * bound(s, a, r)) << at;
      // The share rounded (the bound at 1/4), then m - share rounded once more.
      const double share = s / 4;
      const double want = m[at] - share;
      ASSERT_LE(std::fabs(res[at] - want),
                bound(share, a / 4, r) + 0x1p-24 * (std::fabs(want) + bound(share, a / 4, r)))
          << at;
    }
  }
}

TEST_P(Kernels, OrthonormalizeGivesOrthonormalColumns) {
  const std::size_t r = GetParam(), rows = 80;
  auto p = normals(rows * r, 4);
  std::vector<double> work(rows * r);
  detail::lr_orthonormalize(p.data(), rows, r, work.data());
  // Computed in float64 and rounded: each entry within 2^-24 of its float64 value, whose columns
  // are orthonormal up to float64's error; a dot product of two such columns then moves by at
  // most 2 x 2^-24 sum_i |a_i| |b_i| <= 2 x 2^-24 (Cauchy-Schwarz, unit columns), plus the
  // float64 parts (rows x 2^-52, generously).
  for (std::size_t a = 0; a < r; ++a) {
    for (std::size_t b = 0; b < r; ++b) {
      double dot = 0;
      for (std::size_t i = 0; i < rows; ++i) dot += double(p[i * r + a]) * p[i * r + b];
      EXPECT_NEAR(dot, a == b ? 1.0 : 0.0, 2.1 * 0x1p-24 + double(rows) * 0x1p-52) << a << " " << b;
    }
  }
}

TEST_P(Kernels, SameBitsWithAnyThreadCount) {
  // Big enough for 4 threads (threads_for: 256K elements each).
  const std::size_t r = GetParam(), rows = 1100, cols = 1000;
  const auto m = normals(rows * cols, 5);
  const auto q = normals(cols * r, 6);
  std::vector<float> p1(rows * r), p4(rows * r), q1(cols * r), q4(cols * r);
  std::vector<double> acc(cols * r);
  const int before = num_threads();
  set_num_threads(1);
  detail::lr_multiply(m.data(), rows, cols, q.data(), r, p1.data());
  detail::lr_multiply_t(m.data(), rows, cols, p1.data(), r, q1.data(), acc.data());
  set_num_threads(4);
  detail::lr_multiply(m.data(), rows, cols, q.data(), r, p4.data());
  detail::lr_multiply_t(m.data(), rows, cols, p1.data(), r, q4.data(), acc.data());
  set_num_threads(before);
  EXPECT_EQ(p1, p4);
  EXPECT_EQ(q1, q4);
}

INSTANTIATE_TEST_SUITE_P(Ranks, Kernels, ::testing::Values(1, 2, 3, 4, 8, 9));

TEST(PowerSgdKernels, ZeroColumnsStayZeroAndNanPropagates) {
  std::vector<float> p = {1, 2, 0, 2, 4,
                          0, 3, 6, 0};  // 3 x 3: column 1 = 2 x column 0, column 2 = 0
  std::vector<double> work(9);
  detail::lr_orthonormalize(p.data(), 3, 3, work.data());
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(p[i * 3 + 1], 0.0f, 1e-6);  // in the span of column 0: nothing left
    EXPECT_EQ(p[i * 3 + 2], 0.0f);
  }
  std::vector<float> bad = {1, NAN, 2, 3};
  detail::lr_orthonormalize(bad.data(), 2, 2, work.data());
  EXPECT_TRUE(std::isnan(bad[1]) || std::isnan(bad[3]));
}

TEST(PowerSgdKernels, RandomStartIsUniformAndReproducible) {
  std::vector<float> a(4096), b(4096), c(4096);
  detail::lr_random(a.data(), a.size(), 7);
  detail::lr_random(b.data(), b.size(), 7);
  detail::lr_random(c.data(), c.size(), 8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  double mean = 0, sq = 0;
  for (float v : a) {
    ASSERT_GE(v, -1.0f);
    ASSERT_LT(v, 1.0f);
    ASSERT_EQ(v * 0x1p23f, std::round(v * 0x1p23f));  // a multiple of 2^-23
    mean += v;
    sq += double(v) * v;
  }
  mean /= a.size();
  // Uniform on [-1, 1): mean 0 and variance 1/3; the mean of 4096 draws has standard deviation
  // sqrt(1/3 / 4096) = 0.009: 5 of them is 0.045. The variance's estimate, sd sqrt(4/45 / 4096).
  EXPECT_LT(std::fabs(mean), 0.045);
  EXPECT_NEAR(sq / a.size(), 1.0 / 3, 5 * std::sqrt(4.0 / 45 / 4096));
}

}  // namespace
}  // namespace gcomp
