// Error feedback: v = x + e; p = C(v); e = v - D(p). Over T steps the decodes plus the final
// residual add up to the inputs (exactly, but for the float rounding of the two subtractions
// per step, which the bound accounts for); the residual is really applied; a failed call leaves
// it untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "gcomp/momentum.hpp"
#include "test_util.hpp"

namespace gcomp {
namespace {

class EfInvariant : public ::testing::TestWithParam<std::string> {};

TEST_P(EfInvariant, DecodesPlusResidualEqualInputs) {
  const Codec c(GetParam());
  const std::size_t n = 5003;
  const int steps = 30;
  ErrorFeedback ef(n);
  std::vector<double> sum_x(n, 0), sum_d(n, 0), bound(n, 0), magnitude(n, 0);
  std::vector<float> e_prev(n, 0.0f);
  for (int t = 0; t < steps; ++t) {
    const auto x = test::normal(n, 100 + t, 1.0f + 0.1f * t);
    const auto d = test::decode(c.encode_ef(ef, x, 1000 + t), n);
    const auto e = ef.residual();
    for (std::size_t i = 0; i < n; ++i) {
      const float v = x[i] + e_prev[i];  // what the codec saw
      sum_x[i] += x[i];
      sum_d[i] += d[i];
      // fl(x + e) and fl(v - d) each round by at most 2^-24 of their result (or 2^-150 where
      // it is subnormal).
      bound[i] += 0x1p-24 * (std::fabs(v) + std::fabs(e[i])) + 0x1p-149;
      magnitude[i] += std::fabs(x[i]) + std::fabs(d[i]);
      e_prev[i] = e[i];
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    // The test's own double sums of 2 x 30 terms and the gap add (2 steps + 2) 2^-53 of them.
    const double gap = sum_d[i] + e_prev[i] - sum_x[i];
    const double own = (2 * steps + 2) * 0x1p-53 * (magnitude[i] + std::fabs(e_prev[i]));
    ASSERT_LE(std::fabs(gap), bound[i] + own) << GetParam() << " element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, EfInvariant, ::testing::ValuesIn(test::all_specs()),
                         [](const auto& info) { return test::name_of(info.param); });

// Top-k is a delta-contraction with delta = k/n: ||v - C(v)|| <= sqrt(1 - delta) ||v||, so with
// a fixed input the residual stays below sqrt(1-delta) / (1 - sqrt(1-delta)) ||x|| and the mean
// of the decodes, x - e_T / T, approaches x like 1/T. Without error feedback it never does.
TEST(ErrorFeedback, TopKMeanConvergesToTheInput) {
  const std::size_t n = 1000;
  const auto x = test::normal(n, 7);
  const Codec c("topk:k=10");
  const double delta = 10.0 / n;
  const double q = std::sqrt(1 - delta);
  double xnorm = 0;
  for (float v : x) xnorm += static_cast<double>(v) * v;
  xnorm = std::sqrt(xnorm);
  ErrorFeedback ef(n);
  std::vector<double> sum(n, 0);
  const int steps = 4000;
  for (int t = 0; t < steps; ++t) {
    const auto d = test::decode(c.encode_ef(ef, x, t), n);
    for (std::size_t i = 0; i < n; ++i) sum[i] += d[i];
  }
  double err = 0, enorm = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double m = sum[i] / steps - x[i];
    err += m * m;
    enorm += static_cast<double>(ef.residual()[i]) * ef.residual()[i];
  }
  // In float, v = fl(x + e) rounds by at most u |v| (u = 2^-24; top-k's e = v - C(v) is exact),
  // so ||e|| <= q' / (1 - q') ||x|| with q' = q (1 + u). The decodes add up to T x - e_T plus
  // those roundings, at most u (||x|| + ||e||) per step in norm, and the test's double sums of T
  // terms add T 2^-53 of the largest |v|, at most sqrt(n) (||x|| + ||e||) in norm.
  const double u = 0x1p-24;
  const double q1 = q * (1 + u);
  const double e_bound = q1 / (1 - q1) * xnorm;
  EXPECT_LE(std::sqrt(enorm), e_bound);
  const double rounding = (u + std::sqrt(static_cast<double>(n)) * steps * 0x1p-53) *
                          (xnorm + e_bound);
  // That is, the mean is within q' / ((1 - q') T) ||x|| (5% here) of x, plus rounding.
  EXPECT_LE(std::sqrt(err), e_bound / steps + rounding);
  // Without error feedback the same codec keeps losing 95% of this input's energy... forever.
  const auto d = test::decode(c.encode(x, 0), n);
  double lost = 0;
  for (std::size_t i = 0; i < n; ++i) lost += (d[i] - x[i]) * (d[i] - x[i]);
  EXPECT_GE(std::sqrt(lost) / xnorm, 0.9);
}

TEST(ErrorFeedback, TopKResidualIsTheUnsentPart) {
  const auto x = test::normal(1000, 8);
  ErrorFeedback ef(x.size());
  const auto p = Codec("topk:k=50").encode_ef(ef, x, 0);
  const auto d = test::decode(p, x.size());
  std::size_t sent = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (d[i] != 0) {
      ++sent;
      EXPECT_EQ(ef.residual()[i], 0.0f);
      EXPECT_EQ(d[i], x[i]);
    } else {
      EXPECT_EQ(ef.residual()[i], x[i]);
    }
  }
  EXPECT_EQ(sent, 50u);
}

std::vector<float> snapshot(const ErrorFeedback& ef) {
  return {ef.residual().begin(), ef.residual().end()};
}

TEST(ErrorFeedback, FailedCallsLeaveTheResidualUntouched) {
  for (const auto& spec : test::all_specs()) {
    const Codec c(spec);
    const std::size_t n = 3001;
    auto x = test::normal(n, 9);
    ErrorFeedback ef(n);
    c.encode_ef(ef, x, 1);
    const auto before = snapshot(ef);
    // NaN in the input.
    x[1234] = std::numeric_limits<float>::quiet_NaN();
    try {
      c.encode_ef(ef, x, 2);
      ADD_FAILURE() << spec << " accepted NaN";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Status::nonfinite) << spec;
      EXPECT_NE(std::string(e.what()).find("1234"), std::string::npos) << e.what();
    }
    EXPECT_EQ(snapshot(ef), before) << spec;
    // x + e overflowing although both are finite.
    x[1234] = 3e38f;
    std::vector<float> big(n, 0.0f);
    big[77] = 3.4e38f;
    ErrorFeedback ef2(n);
    c.encode_ef(ef2, big, 3);  // leaves most of 3.4e38 in the residual for most codecs
    if (std::fabs(ef2.residual()[77]) > 1e38f) {
      const auto r2 = snapshot(ef2);
      std::vector<float> push(n, 0.0f);
      push[77] = std::copysign(3.4e38f, ef2.residual()[77]);
      EXPECT_THROW(c.encode_ef(ef2, push, 4), Error) << spec;
      EXPECT_EQ(snapshot(ef2), r2) << spec;
    }
    // Output too small.
    x[1234] = 0.5f;
    std::vector<std::byte> small(10);
    try {
      c.encode_ef(ef, x, 5, small);
      ADD_FAILURE() << spec;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Status::buffer_too_small) << spec;
    }
    EXPECT_EQ(snapshot(ef), before) << spec;
    // Size mismatch.
    ErrorFeedback other(n + 1);
    try {
      c.encode_ef(other, x, 5);
      ADD_FAILURE() << spec;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Status::invalid_argument) << spec;
    }
  }
}

// DGC's momentum correction around error feedback: the velocity is what top-k compresses, the
// residual accumulates it, and after the send the velocity is zero exactly where top-k sent.
TEST(Momentum, CorrectionAndMaskingAroundErrorFeedback) {
  const Codec topk("topk:k=10");
  const std::size_t n = 200;
  std::vector<float> u(n, 0.0f), g = test::normal(n, 4);
  ErrorFeedback ef(n);
  for (int step = 0; step < 3; ++step) {
    std::vector<float> grad = test::normal(n, 10 + static_cast<std::uint32_t>(step));
    const std::vector<float> u_before = u, fresh = grad;
    momentum_correct(u, grad, 0.5f);
    for (std::size_t i = 0; i < n; ++i) {
      volatile float product = 0.5f * u_before[i];  // rounded on its own, as the library does
      ASSERT_EQ(u[i], product + fresh[i]);
      ASSERT_EQ(grad[i], u[i]);
    }
    topk.encode_ef(ef, grad, 0);
    const std::vector<float> u_sent = u;
    EXPECT_TRUE(mask_momentum(u, std::as_const(ef).residual()));
    std::size_t zeroed = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (std::as_const(ef).residual()[i] == 0.0f) {
        EXPECT_EQ(u[i], 0.0f);
        ++zeroed;
      } else {
        EXPECT_EQ(u[i], u_sent[i]);
      }
    }
    EXPECT_EQ(zeroed, 10u);  // top-k's k, the inputs having no zeros
  }
  // A residual all zero (the tensor sent whole) leaves the velocity as it is.
  const std::vector<float> kept = u;
  EXPECT_FALSE(mask_momentum(u, std::vector<float>(n, 0.0f)));
  EXPECT_EQ(u, kept);
  EXPECT_THROW(momentum_correct(u, g, 1.0f), Error);
  EXPECT_THROW(momentum_correct(u, std::span<float>(g.data(), 5), 0.5f), Error);
  EXPECT_THROW(mask_momentum(u, std::vector<float>(5, 1.0f)), Error);
}

}  // namespace
}  // namespace gcomp
