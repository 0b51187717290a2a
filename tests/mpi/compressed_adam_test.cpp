// CompressedAdam (gcomp/compressed_adam.hpp) on P ranks: the warm-up is exact Adam on the
// averaged gradient, the compressed stage with codec none is Adam with the frozen variance on
// the averaged momentum, a 1-bit codec with error feedback on both sides keeps every rank's
// parameters the same bits, and a restored state goes on bit for bit.
#include "gcomp/compressed_adam.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "feedback_slot.hpp"
#include "mpi_util.hpp"

namespace gcomp {
namespace {

using test::rank;
using test::size;

// Three tensors (a matrix, a vector below dense_below, an odd length) of every rank's
// parameters (the same on every rank) and its own gradients for step t.
const std::vector<MatrixShape> kShapes{{40, 30}, {17, 1}, {1201, 1}};

// n normal values of a seed, the same on every rank.
std::vector<float> values(std::size_t n, std::uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = d(g);
  return x;
}

std::vector<std::vector<float>> start_params() {
  std::vector<std::vector<float>> p;
  for (std::size_t i = 0; i < kShapes.size(); ++i) {
    p.push_back(values(kShapes[i].rows * kShapes[i].cols, 10 + i));
  }
  return p;
}

std::vector<float> grad_of(std::size_t i, int r, int t) {
  return values(kShapes[i].rows * kShapes[i].cols, 1000 * (t + 1) + 100 * r + i);
}

void run(CompressedAdam& adam, std::vector<std::vector<float>>& params, int from, int to,
         double lr) {
  for (int t = from; t < to; ++t) {
    std::vector<std::vector<float>> grads;
    for (std::size_t i = 0; i < params.size(); ++i) grads.push_back(grad_of(i, rank(), t));
    const std::vector<std::span<float>> ps(params.begin(), params.end());
    const std::vector<std::span<float>> gs(grads.begin(), grads.end());
    adam.step(test::world(), ps, gs, lr);
  }
}

// The reference on every rank alone: the gradients' average in double, Adam in double, the
// variance frozen after warmup steps and the momentum then fed the averaged gradient (the
// average of the ranks' momenta, the momentum being linear in the gradient), each frozen step
// within exact Adam's bound.
std::vector<std::vector<double>> reference(const AdamSettings& s, int warmup, int steps,
                                           double lr) {
  std::vector<std::vector<double>> p, m, v;
  for (const auto& x : start_params()) {
    p.emplace_back(x.begin(), x.end());
    m.emplace_back(x.size(), 0.0);
    v.emplace_back(x.size(), 0.0);
  }
  for (int t = 1; t <= steps; ++t) {
    for (std::size_t i = 0; i < p.size(); ++i) {
      std::vector<double> g(p[i].size(), 0.0);
      for (int r = 0; r < size(); ++r) {
        const auto gr = grad_of(i, r, t - 1);
        for (std::size_t k = 0; k < g.size(); ++k) g[k] += gr[k] / size();
      }
      const int tv = std::min(t, warmup);
      for (std::size_t k = 0; k < g.size(); ++k) {
        if (s.decoupled)
          p[i][k] *= 1 - lr * s.weight_decay;
        else
          g[k] += s.weight_decay * p[i][k];
        m[i][k] = s.beta1 * m[i][k] + (1 - s.beta1) * g[k];
        if (t <= warmup) v[i][k] = s.beta2 * v[i][k] + (1 - s.beta2) * g[k] * g[k];
        const double mh = m[i][k] / (1 - std::pow(s.beta1, t));
        const double vh = v[i][k] / (1 - std::pow(s.beta2, tv));
        double q = mh / (std::sqrt(vh) + s.eps);
        if (t > warmup) {  // the frozen stage keeps exact Adam's bound (gcomp/adam.hpp)
          const double bound = std::max(1.0, (1 - s.beta1) / std::sqrt(1 - s.beta2));
          q = vh == 0 ? 0 : std::clamp(q, -bound, bound);
        }
        p[i][k] -= lr * q;
      }
    }
  }
  return p;
}

class CompressedAdamStages : public ::testing::TestWithParam<bool> {};

TEST_P(CompressedAdamStages, WarmupIsAdamAndThenTheFrozenVarianceWithCodecNone) {
  // 3 exact steps, then 5 with the momentum averaged uncompressed: the reference in double, up
  // to float's roundings (the bound of adam_test.cpp's ManySteps, plus the averages' own).
  const AdamSettings s{
      .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.01, .decoupled = GetParam()};
  const double lr = 1e-3;
  const int warmup = 3, steps = 8;
  CompressedAdamOptions o{.adam = s, .warmup_steps = warmup};
  o.bucket.allreduce.algorithm = Algorithm::dense;
  CompressedAdam adam(Codec("none"), kShapes, o);
  auto params = start_params();
  run(adam, params, 0, steps, lr);
  EXPECT_EQ(adam.steps(), static_cast<std::uint64_t>(steps));
  EXPECT_EQ(adam.variance_steps(), static_cast<std::uint64_t>(warmup));
  EXPECT_TRUE(adam.compressing());
  const auto want = reference(s, warmup, steps, lr);
  const double bound = lr * (1 - s.beta1) / std::sqrt(1 - s.beta2);
  double moves = 0;
  for (int t = 1; t <= steps; ++t) moves += bound * (t + 10 + size()) * 0x1p-24;
  for (std::size_t i = 0; i < params.size(); ++i) {
    for (std::size_t k = 0; k < params[i].size(); ++k) {
      const double ulp =
          std::ldexp(1.0, std::ilogb(std::max(std::fabs(want[i][k]), 0x1p-126)) - 23);
      ASSERT_NEAR(params[i][k], want[i][k], moves + steps * ulp) << i << " " << k;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AdamAndAdamW, CompressedAdamStages, ::testing::Bool());

// Every rank's copy of x equals rank 0's, bit for bit.
void expect_same_on_every_rank(const std::vector<float>& x) {
  std::vector<float> root = x;
  MPI_Bcast(root.data(), static_cast<int>(root.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  int same = std::memcmp(root.data(), x.data(), x.size() * sizeof(float)) == 0;
  MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  EXPECT_TRUE(same);
}

TEST(CompressedAdam, OneBitWithBothResidualsKeepsEveryRanksParametersTheSame) {
  CompressedAdamOptions o{.adam = {.weight_decay = 0.01, .decoupled = true}, .warmup_steps = 2};
  o.bucket.allreduce.algorithm = Algorithm::compressed_reduce_scatter;
  o.bucket.allreduce.allow_uncompressed = false;
  o.bucket.bucket_bytes = 1;  // each tensor a sign of its own scale
  CompressedAdam adam(Codec("sign"), kShapes, o);
  auto params = start_params();
  run(adam, params, 0, 10, 2e-3);
  for (std::size_t i = 0; i < params.size(); ++i) expect_same_on_every_rank(params[i]);
  // The large tensors' residuals: each rank's, and with several ranks each owner's of its chunk.
  for (const std::size_t i : {std::size_t{0}, std::size_t{2}}) {
    const auto e = adam.feedback(i).residual();
    EXPECT_TRUE(std::any_of(e.begin(), e.end(), [](float x) { return x != 0.0f; })) << i;
    const std::vector<float>& owner = detail::FeedbackSlot::of(adam.feedback(i));
    const std::size_t n = e.size(), r = static_cast<std::size_t>(rank());
    const std::size_t p = static_cast<std::size_t>(size());
    if (size() > 1) {
      EXPECT_EQ(owner.size(), (r + 1) * n / p - r * n / p) << i;
    }
  }
}

TEST(CompressedAdam, ARestoredStateGoesOnBitForBit) {
  // N + M steps against N, the state copied into a new CompressedAdam, then M.
  const auto options = [] {
    CompressedAdamOptions o{.adam = {.weight_decay = 0.01, .decoupled = true}, .warmup_steps = 3};
    o.bucket.allreduce.algorithm = Algorithm::compressed_reduce_scatter;
    o.bucket.allreduce.allow_uncompressed = false;
    o.bucket.allreduce.seed = 42;
    return o;
  };
  const int n = 5, m = 4;
  CompressedAdam whole(Codec("qsgd:bits=4"), kShapes, options());
  auto straight = start_params();
  run(whole, straight, 0, n + m, 1e-3);

  CompressedAdam first(Codec("qsgd:bits=4"), kShapes, options());
  auto resumed = start_params();
  run(first, resumed, 0, n, 1e-3);
  CompressedAdam second(Codec("qsgd:bits=4"), kShapes, options());
  second.restore(first.steps(), first.variance_steps());
  for (std::size_t i = 0; i < kShapes.size(); ++i) {
    std::ranges::copy(first.exp_avg(i), second.exp_avg(i).begin());
    std::ranges::copy(first.exp_avg_sq(i), second.exp_avg_sq(i).begin());
    second.feedback(i) = first.feedback(i);
  }
  run(second, resumed, n, n + m, 1e-3);
  EXPECT_EQ(resumed, straight);
}

TEST(CompressedAdam, BadInputIsAnError) {
  EXPECT_THROW(CompressedAdam(Codec("sign"), kShapes, {.warmup_steps = 0}), Error);
  CompressedAdam adam(Codec("sign"), kShapes, {.warmup_steps = 2});
  EXPECT_THROW(adam.restore(5, 5), Error);  // the variance froze after 2
  EXPECT_THROW(adam.restore(1, 2), Error);
  adam.restore(5, 2);
  EXPECT_EQ(adam.steps(), 5u);
  auto params = start_params();
  std::vector<std::span<float>> ps(params.begin(), params.end());
  std::vector<std::span<float>> two(ps.begin(), ps.begin() + 2);
  try {  // checked before anything is sent: no rank waits
    adam.step(test::world(), two, two, 1e-3);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Status::invalid_argument);
  }
  EXPECT_THROW(adam.step(test::world(), ps, ps, -1.0), Error);
  EXPECT_EQ(params, start_params());
}

}  // namespace
}  // namespace gcomp
