// Unbiasedness of the stochastic codecs, by averaging the decode over T seeds, with bounds that
// come from each codec's variance, not from tuning:
//   * per element: |mean_i - x_i| <= z sqrt(var_i / T) + the 2^-16 resolution of the draws
//     + the float rounding of a decode, with z = 5.5 (a normal tail of 4e-8 per element, ~1e-4
//     over all elements). The draws are 16-bit, so a rounding probability p is realised as a
//     multiple of 2^-16: the mean is off by at most 2^-16 of the decode's unit m_i (a QSGD step,
//     TernGrad's scale, 0 for random-k), and var_i is taken as at least the variance of a 2^-16
//     coin. A decode is a product of at most three rounded float factors (norm, step, level;
//     scale and n/k), and the probability is a rounded float quotient: together at most
//     8 u (|x_i| + m_i), u = 2^-24; the double mean over T trials adds T 2^-53 relative, less;
//   * in total: ||mean - x||^2 <= 1.5 * sum(var_i) / T; the left side is a sum of n independent
//     terms whose expectation is sum(var_i) / T and whose relative spread is about sqrt(2 / n),
//     so 1.5 leaves over five standard deviations;
//   * QSGD also has its Lemma 3.1: E||Q(v) - v||^2 <= min(D/s^2, sqrt(D)/s) ||v||^2 per bucket,
//     checked on the per-trial error averaged over the T trials.
// Seeds are fixed, so the outcome is deterministic. A biased codec run through the same check
// fails it (the negative controls at the end), so the check can fail.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "test_util.hpp"

namespace gcomp {
namespace {

constexpr double kZ = 5.5;
constexpr int kTrials = 20000;

struct Check {
  double worst_z = 0;        // max over i of |mean_i - x_i| / allowed_i (fails above 1)
  double total_ratio = 0;    // ||mean - x||^2 / (sum var_i / T) (fails above 1.5)
  double mse_per_trial = 0;  // mean over trials of ||D(C(x)) - x||^2
};

// var(i): the variance of one decode of element i; unit(i): the decode's unit m_i.
Check run(const std::string& spec, const std::vector<float>& x,
          const std::function<double(std::size_t)>& var,
          const std::function<double(std::size_t)>& unit) {
  const Codec c(spec);
  const std::size_t n = x.size();
  std::vector<double> sum(n, 0.0);
  std::vector<float> y(n);
  std::vector<std::byte> p(c.max_bytes(n));
  double sq = 0;
  for (int t = 0; t < kTrials; ++t) {
    std::fill(y.begin(), y.end(), 0.0f);
    const std::size_t bytes = c.encode(x, static_cast<std::uint64_t>(t) * 7919 + 1, p);
    decode_add(std::span<const std::byte>(p.data(), bytes), y);
    for (std::size_t i = 0; i < n; ++i) {
      sum[i] += y[i];
      sq += (static_cast<double>(y[i]) - x[i]) * (static_cast<double>(y[i]) - x[i]);
    }
  }
  Check r;
  double total = 0, total_var = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double err = sum[i] / kTrials - x[i];
    const double allowed = kZ * std::sqrt(var(i) / kTrials) + unit(i) * 0x1p-16 +
                           8 * 0x1p-24 * (std::fabs(x[i]) + unit(i));
    r.worst_z = std::max(r.worst_z, std::fabs(err) / allowed);
    total += err * err;
    total_var += var(i) / kTrials;
  }
  r.total_ratio = total / total_var;
  r.mse_per_trial = sq / kTrials;
  return r;
}

double norm2(const std::vector<float>& x, std::size_t b, std::size_t e) {
  double s = 0;
  for (std::size_t i = b; i < e; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

void check_qsgd(int bits, std::size_t bucket) {
  const std::string spec =
      "qsgd:bits=" + std::to_string(bits) + ",bucket=" + std::to_string(bucket);
  const auto x = test::normal(2048, 31);
  const double s = (1 << (bits - 1)) - 1;
  std::vector<double> step(x.size());
  double lemma = 0;
  for (std::size_t b = 0; b < x.size(); b += bucket) {
    const std::size_t e = std::min(x.size(), b + bucket);
    const double nb = norm2(x, b, e);
    const double d = static_cast<double>(e - b);
    lemma += std::min(d / (s * s), std::sqrt(d) / s) * nb;
    for (std::size_t i = b; i < e; ++i) step[i] = std::sqrt(nb) / s;
  }
  // One element: level l or l + 1 steps with probability f = frac(|x| / step): var = step^2 f(1-f).
  const auto var = [&](std::size_t i) {
    const double r = std::fabs(x[i]) / step[i];
    const double f = r - std::floor(r);
    return step[i] * step[i] * std::max(f * (1 - f), 0x1p-16);
  };
  const auto unit = [&](std::size_t i) { return step[i]; };
  const Check r = run(spec, x, var, unit);
  EXPECT_LE(r.worst_z, 1.0) << spec;
  EXPECT_LE(r.total_ratio, 1.5) << spec;
  EXPECT_LE(r.mse_per_trial, lemma) << spec << ": Lemma 3.1 bound " << lemma;
}

TEST(Unbiased, Qsgd4BitBucket512) { check_qsgd(4, 512); }
TEST(Unbiased, Qsgd8Bit) { check_qsgd(8, 512); }
TEST(Unbiased, Qsgd2BitBucket64) { check_qsgd(2, 64); }
TEST(Unbiased, Qsgd3BitBucket100) { check_qsgd(3, 100); }

TEST(Unbiased, TernGradWithoutClipping) {
  const auto x = test::normal(2048, 32);
  double s = 0;
  for (float v : x) s = std::max(s, static_cast<double>(std::fabs(v)));
  // b ~ Bernoulli(|g| / s), decode s * sign * b: var = |g| (s - |g|) (TernGrad, Sec. 3).
  const auto var = [&](std::size_t i) {
    return std::max(std::fabs(x[i]) * (s - std::fabs(x[i])), s * s * 0x1p-16);
  };
  const auto unit = [&](std::size_t) { return s; };
  const Check r = run("terngrad:clip=0", x, var, unit);
  EXPECT_LE(r.worst_z, 1.0);
  EXPECT_LE(r.total_ratio, 1.5);
}

TEST(Unbiased, RandomKScaled) {
  const auto x = test::normal(2048, 33);
  const double n = 2048, k = 205;  // ratio 0.1
  // x * n/k with probability k/n, else 0: var = x^2 (n/k - 1).
  const auto var = [&](std::size_t i) { return static_cast<double>(x[i]) * x[i] * (n / k - 1); };
  const auto unit = [&](std::size_t) { return 0.0; };
  const Check r = run("randomk:ratio=0.1,scale=true", x, var, unit);
  EXPECT_LE(r.worst_z, 1.0);
  EXPECT_LE(r.total_ratio, 1.5);
}

// The same checks reject biased codecs.
TEST(Unbiased, NegativeControlsFail) {
  const auto x = test::normal(2048, 33);
  const double n = 2048, k = 205;
  const auto var = [&](std::size_t i) { return static_cast<double>(x[i]) * x[i] * (n / k - 1); };
  const Check unscaled = run("randomk:ratio=0.1", x, var, [](std::size_t) { return 0.0; });
  EXPECT_GT(unscaled.worst_z, 1.0);
  EXPECT_GT(unscaled.total_ratio, 1.5);
  // TernGrad with clipping shrinks the values beyond 2.5 sigma.
  auto heavy = test::normal(2048, 34);
  heavy[100] = 12.0f;
  heavy[200] = -9.0f;
  double s = 0;
  for (float v : heavy) s = std::max(s, static_cast<double>(std::fabs(v)));
  const auto tvar = [&](std::size_t i) { return std::fabs(heavy[i]) * (s - std::fabs(heavy[i])); };
  const Check clipped = run("terngrad", heavy, tvar, [&](std::size_t) { return s; });
  EXPECT_GT(clipped.worst_z, 1.0);
}

}  // namespace
}  // namespace gcomp
