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

// 0/1 Adam's reference in double, every rank's own state kept: refreshing steps are exact Adam
// on the averaged gradient (v's bias correction by its refreshes, bounded where m has had more
// updates), the other synchronized steps average the ranks' momenta, local steps move each rank
// on its own, and a synchronization averages the ranks' ways from the anchor as momenta.
std::vector<std::vector<double>> zero_one_reference(const AdamSettings& s, const AdamSchedule& sc,
                                                    int steps, double lr) {
  const int ranks = size();
  const double bound = std::max(1.0, (1 - s.beta1) / std::sqrt(1 - s.beta2));
  struct Rank {
    std::vector<std::vector<double>> p, m;
  };
  std::vector<Rank> rs(ranks);
  std::vector<std::vector<double>> v, anchor;
  for (const auto& x : start_params()) {
    for (Rank& r : rs) {
      r.p.emplace_back(x.begin(), x.end());
      r.m.emplace_back(x.size(), 0.0);
    }
    v.emplace_back(x.size(), 0.0);
  }
  double lr_sum = 0, decay = 1;
  for (int t = 1; t <= steps; ++t) {
    const auto ut = static_cast<std::uint64_t>(t);
    const double tv = static_cast<double>(sc.variance_steps(ut));
    const double b1 = 1 - std::pow(s.beta1, t), b2 = 1 - std::pow(s.beta2, tv);
    const bool refresh = sc.refreshes(ut), local = sc.local(ut);
    if (local && ut - 1 == sc.frozen_after()) {
      anchor = rs[0].p;
      lr_sum = 0;
      decay = 1;
    }
    if (local) {
      lr_sum += lr;
      if (s.decoupled) decay *= 1 - lr * s.weight_decay;
    }
    for (std::size_t i = 0; i < v.size(); ++i) {
      std::vector<double> avg_m(v[i].size(), 0.0);
      std::vector<std::vector<double>> own(ranks);
      for (int r = 0; r < ranks; ++r) {
        const auto g = grad_of(i, r, t - 1);
        own[r].resize(g.size());
        for (std::size_t k = 0; k < g.size(); ++k) {
          double gk = g[k];
          if (!s.decoupled) gk += s.weight_decay * rs[r].p[i][k];
          own[r][k] = s.beta1 * rs[r].m[i][k] + (1 - s.beta1) * gk;
          avg_m[k] += own[r][k] / ranks;
          if (refresh) own[r][k] = gk;  // the refresh averages the gradient
        }
      }
      if (refresh) {
        for (std::size_t k = 0; k < v[i].size(); ++k) {
          double g = 0;
          for (int r = 0; r < ranks; ++r) g += own[r][k] / ranks;
          v[i][k] = s.beta2 * v[i][k] + (1 - s.beta2) * g * g;
        }
      }
      for (int r = 0; r < ranks; ++r) {
        for (std::size_t k = 0; k < v[i].size(); ++k) {
          const double mk = local ? own[r][k] : avg_m[k];
          double& p = rs[r].p[i][k];
          if (s.decoupled) p *= 1 - lr * s.weight_decay;
          rs[r].m[i][k] = mk;
          const double vh = v[i][k] / b2;
          double q = mk / b1 / (std::sqrt(vh) + s.eps);
          if (tv != t) q = vh == 0 ? 0 : std::clamp(q, -bound, bound);
          p -= lr * q;
        }
      }
    }
    if (local && sc.synchronizes(ut)) {
      for (std::size_t i = 0; i < v.size(); ++i) {
        for (std::size_t k = 0; k < v[i].size(); ++k) {
          const double denom = std::sqrt(v[i][k] / b2) + s.eps;
          double x = 0;
          for (int r = 0; r < ranks; ++r) {
            x += (decay * anchor[i][k] - rs[r].p[i][k]) * denom / lr_sum / ranks;
          }
          const double q = v[i][k] == 0 ? 0 : std::clamp(x / denom, -bound, bound);
          anchor[i][k] = decay * anchor[i][k] - lr_sum * q;
          for (Rank& r : rs) {
            r.p[i][k] = anchor[i][k];
            r.m[i][k] = x * b1;
          }
        }
      }
      lr_sum = 0;
      decay = 1;
    }
  }
  return rs[static_cast<std::size_t>(rank())].p;
}

class CompressedAdamStages : public ::testing::TestWithParam<bool> {};

TEST_P(CompressedAdamStages, WarmupIsAdamAndThenTheFrozenVarianceWithCodecNone) {
  // 3 exact steps, then 5 with the momentum averaged uncompressed: the reference in double, up
  // to float's roundings (the bound of adam_test.cpp's ManySteps, plus the averages' own).
  const AdamSettings s{
      .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.01, .decoupled = GetParam()};
  const double lr = 1e-3;
  const int warmup = 3, steps = 8;
  CompressedAdamOptions o{.adam = s, .schedule = AdamSchedule::one_bit(warmup)};
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

// Whether every rank's copy of x equals rank 0's, bit for bit (on every rank).
bool same_on_every_rank(const std::vector<float>& x) {
  std::vector<float> root = x;
  MPI_Bcast(root.data(), static_cast<int>(root.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  int same = std::memcmp(root.data(), x.data(), x.size() * sizeof(float)) == 0;
  MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return same != 0;
}

void expect_same_on_every_rank(const std::vector<float>& x) { EXPECT_TRUE(same_on_every_rank(x)); }

// zero_one(freeze 10, kappa 2, H 4, doubling every 3): refreshes at 1, 2, 4, 6, 10; local from 11,
// synchronized at 11, 12, 13, 14, 16, 18, 22, 26.
const AdamSchedule kZeroOne = AdamSchedule::zero_one(10, 2, 4, 3);

TEST_P(CompressedAdamStages, ZeroOneWithCodecNoneIsItsReference) {
  const AdamSettings s{
      .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.01, .decoupled = GetParam()};
  const double lr = 1e-3;
  for (const int steps : {6, 9, 13, 16, 17, 22, 25}) {  // ends of every kind of step
    CompressedAdamOptions o{.adam = s, .schedule = kZeroOne};
    o.bucket.allreduce.algorithm = Algorithm::dense;
    CompressedAdam adam(Codec("none"), kShapes, o);
    auto params = start_params();
    run(adam, params, 0, steps, lr);
    EXPECT_EQ(adam.variance_steps(), kZeroOne.variance_steps(static_cast<std::uint64_t>(steps)));
    const auto want = zero_one_reference(s, kZeroOne, steps, lr);
    const double bound = lr * (1 - s.beta1) / std::sqrt(1 - s.beta2);
    double moves = 0;
    for (int t = 1; t <= steps; ++t) moves += bound * (t + 10 + size()) * 0x1p-24;
    for (std::size_t i = 0; i < params.size(); ++i) {
      for (std::size_t k = 0; k < params[i].size(); ++k) {
        const double ulp =
            std::ldexp(1.0, std::ilogb(std::max(std::fabs(want[i][k]), 0x1p-126)) - 23);
        ASSERT_NEAR(params[i][k], want[i][k], 4 * (moves + steps * ulp))
            << "steps " << steps << " tensor " << i << " element " << k;
      }
    }
  }
}

// AdamW (weight decay 0.01) on a schedule, on compressed_reduce_scatter (each rank's residual
// and each owner's), always compressed.
CompressedAdamOptions both_residuals(const AdamSchedule& schedule) {
  CompressedAdamOptions o{.adam = {.weight_decay = 0.01, .decoupled = true}, .schedule = schedule};
  o.bucket.allreduce.algorithm = Algorithm::compressed_reduce_scatter;
  o.bucket.allreduce.allow_uncompressed = false;
  return o;
}

TEST(CompressedAdam, OneBitWithBothResidualsKeepsEveryRanksParametersTheSame) {
  CompressedAdamOptions o = both_residuals(AdamSchedule::one_bit(2));
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

TEST(AdamSchedule, RefreshesAndSynchronizationsAreZeroOneAdams) {
  std::vector<std::uint64_t> refreshes, syncs;
  for (std::uint64_t t = 1; t <= 30; ++t) {
    if (kZeroOne.refreshes(t)) refreshes.push_back(t);
    if (kZeroOne.local(t) && kZeroOne.synchronizes(t)) syncs.push_back(t);
    EXPECT_EQ(kZeroOne.local(t), t > 10) << t;
    EXPECT_TRUE(kZeroOne.local(t) || kZeroOne.synchronizes(t)) << t;
  }
  EXPECT_EQ(refreshes, (std::vector<std::uint64_t>{1, 2, 4, 6, 10}));
  EXPECT_EQ(syncs, (std::vector<std::uint64_t>{11, 12, 13, 14, 16, 18, 22, 26, 30}));
  EXPECT_EQ(kZeroOne.variance_steps(9), 4u);
  EXPECT_EQ(kZeroOne.variance_steps(1000), 5u);
  // DeepSpeed's defaults (kappa 16): 16 refreshes a step, 16 every 2nd, 16 every 4th.
  const AdamSchedule ds = AdamSchedule::zero_one(1000);
  EXPECT_EQ(ds.variance_steps(16), 16u);
  EXPECT_EQ(ds.variance_steps(48), 32u);
  EXPECT_EQ(ds.variance_steps(112), 48u);
  EXPECT_TRUE(ds.refreshes(18) && !ds.refreshes(17) && ds.refreshes(52) && !ds.refreshes(50));
  // 1-bit Adam's: exact steps 1..W, every step synchronized.
  const AdamSchedule one = AdamSchedule::one_bit(3);
  for (std::uint64_t t = 1; t <= 10; ++t) {
    EXPECT_EQ(one.refreshes(t), t <= 3) << t;
    EXPECT_TRUE(one.synchronizes(t) && !one.local(t)) << t;
  }
  EXPECT_EQ(one.variance_steps(10), 3u);
}

TEST(CompressedAdam, ZeroOneIsTheSameOnEveryRankWhenSynchronizedAndNotBetween) {
  CompressedAdam adam(Codec("sign"), kShapes, both_residuals(kZeroOne));
  auto params = start_params();
  for (int t = 1; t <= 26; ++t) {
    run(adam, params, t - 1, t, 2e-3);
    const bool synced = kZeroOne.synchronizes(static_cast<std::uint64_t>(t));
    EXPECT_EQ(adam.last_step_sent(), synced) << "step " << t;  // local steps send nothing
    EXPECT_EQ(same_on_every_rank(params[0]), synced || size() == 1) << "step " << t;
    if (synced) {
      for (std::size_t i = 0; i < params.size(); ++i) {
        EXPECT_TRUE(same_on_every_rank(params[i])) << "step " << t << " tensor " << i;
        if (kZeroOne.local(static_cast<std::uint64_t>(t))) {
          EXPECT_EQ(params[i], std::vector<float>(adam.anchor(i).begin(), adam.anchor(i).end()));
        }
      }
    }
  }
}

TEST(CompressedAdam, ASynchronizationAheadOfTheScheduleMakesTheRanksAgree) {
  CompressedAdam adam(Codec("sign"), kShapes, both_residuals(kZeroOne));
  auto params = start_params();
  std::vector<std::span<float>> ps(params.begin(), params.end());
  run(adam, params, 0, 8, 2e-3);  // not yet local: the ranks agree, nothing is sent
  adam.synchronize(test::world(), ps);
  EXPECT_FALSE(adam.last_step_sent());
  run(adam, params, 8, 20, 2e-3);  // local, in the interval that ends at 22
  ASSERT_GT(adam.local_lr_sum(), 0.0);
  adam.synchronize(test::world(), ps);
  EXPECT_TRUE(adam.last_step_sent());
  EXPECT_EQ(adam.local_lr_sum(), 0.0);
  for (std::size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(same_on_every_rank(params[i])) << i;
    EXPECT_EQ(params[i], std::vector<float>(adam.anchor(i).begin(), adam.anchor(i).end()));
  }
  adam.synchronize(test::world(), ps);  // again: nothing to average
  EXPECT_FALSE(adam.last_step_sent());
  run(adam, params, 20, 22, 2e-3);  // the schedule's synchronization at 22 goes on
  for (std::size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(same_on_every_rank(params[i])) << i;
  EXPECT_THROW(adam.synchronize(test::world(), std::span(ps).first(2)), Error);
}

// N + M steps against N, the whole state copied into a new CompressedAdam (restore() and the
// accessors, as a checkpoint carries them), then M: the same parameters, bit for bit.
void expect_restored_bit_for_bit(const char* codec, const AdamSchedule& schedule, int n, int m) {
  CompressedAdamOptions o = both_residuals(schedule);
  o.bucket.allreduce.seed = 42;
  CompressedAdam whole(Codec(codec), kShapes, o);
  auto straight = start_params();
  run(whole, straight, 0, n + m, 1e-3);

  CompressedAdam first(Codec(codec), kShapes, o);
  auto resumed = start_params();
  run(first, resumed, 0, n, 1e-3);
  CompressedAdam second(Codec(codec), kShapes, o);
  second.restore(first.steps(), first.variance_steps(), first.local_lr_sum(), first.local_decay());
  for (std::size_t i = 0; i < kShapes.size(); ++i) {
    std::ranges::copy(first.exp_avg(i), second.exp_avg(i).begin());
    std::ranges::copy(first.exp_avg_sq(i), second.exp_avg_sq(i).begin());
    std::ranges::copy(first.anchor(i), second.anchor(i).begin());
    second.feedback(i) = first.feedback(i);
  }
  run(second, resumed, n, n + m, 1e-3);
  EXPECT_EQ(resumed, straight);
}

TEST(CompressedAdam, ARestoredStateGoesOnBitForBit) {
  expect_restored_bit_for_bit("qsgd:bits=4", AdamSchedule::one_bit(3), 5, 4);
}

TEST(CompressedAdam, ARestoredZeroOneStateGoesOnBitForBitBetweenSynchronizations) {
  // Resumed after 20 steps (local, in an interval of 4 that ends at 22), for 6 more.
  ASSERT_TRUE(kZeroOne.local(20) && !kZeroOne.synchronizes(20));
  expect_restored_bit_for_bit("sign", kZeroOne, 20, 6);
}

TEST(CompressedAdam, BadInputIsAnError) {
  EXPECT_THROW(CompressedAdam(Codec("sign"), kShapes, {.schedule = AdamSchedule::one_bit(0)}),
               Error);
  CompressedAdam adam(Codec("sign"), kShapes, {.schedule = AdamSchedule::one_bit(2)});
  EXPECT_THROW(adam.restore(5, 5), Error);  // the variance froze after 2
  EXPECT_THROW(adam.restore(1, 2), Error);
  adam.restore(5, 2);
  EXPECT_EQ(adam.steps(), 5u);
  EXPECT_THROW(adam.restore(5, 2, -1.0), Error);
  EXPECT_THROW(adam.restore(5, 2, 0.0, 0.0), Error);
  EXPECT_TRUE(adam.anchor(0).empty());  // no local steps
  CompressedAdam zero_one(Codec("sign"), kShapes, {.schedule = kZeroOne});
  EXPECT_THROW(zero_one.restore(5, 4), Error);  // 1, 2, 4: 3 refreshes
  zero_one.restore(5, 3);
  for (const AdamSchedule bad :
       {AdamSchedule{.max_local_steps = 0}, AdamSchedule{.local_double_every = 0},
        AdamSchedule{.freeze_step = (std::uint64_t{1} << 40) + 1}}) {
    EXPECT_THROW(CompressedAdam(Codec("sign"), kShapes, {.schedule = bad}), Error);
  }
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
