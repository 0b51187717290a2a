// The low_rank algorithm (powersgd) through allreduce_buckets with shapes: against a float64
// computation of the same steps, conservation with error feedback, warm and cold start, the
// alternating form, what goes dense, bit-identical results across SIMD levels, and the ranks'
// disagreements failing every rank.
#include "low_rank.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <vector>

#include "agreement.hpp"
#include "gcomp/communicator.hpp"
#include "gcomp/gcomp_mpi.h"
#include "low_rank_reference.hpp"
#include "mpi_util.hpp"
#include "simd.hpp"

namespace gcomp {
namespace {

using test::first_q;
using test::frob;
using test::gather;
using test::gram_schmidt;
using test::inverse_norm;
using test::kU;
using test::rank;
using test::Reference;
using test::reference_step;
using test::size;
using test::status_of;
using test::sum_double;
using test::world;

// Everything in buckets (no separate bucket of small tensors), low_rank asked for by name so
// that auto's choice cannot change what a test checks.
BucketOptions explicit_low_rank(std::uint64_t seed = 11, Algorithm a = Algorithm::low_rank) {
  BucketOptions o;
  o.dense_below = 0;
  o.allreduce.algorithm = a;
  o.allreduce.seed = seed;
  return o;
}

struct Tensors {
  std::vector<std::vector<float>> data;
  std::vector<MatrixShape> shapes;
  std::vector<std::span<float>> spans() {
    return std::vector<std::span<float>>(data.begin(), data.end());
  }
};

Tensors random_tensors(const std::vector<MatrixShape>& shapes, std::uint32_t seed) {
  Tensors t;
  t.shapes = shapes;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    t.data.push_back(test::input(shapes[i].rows * shapes[i].cols, seed * 101 + i));
  }
  return t;
}

void run(Tensors& t, const Codec& codec, std::vector<ErrorFeedback*> efs = {},
         const BucketOptions& o = explicit_low_rank(), Communicator& c = world()) {
  const auto spans = t.spans();
  c.allreduce_buckets(spans, t.shapes, codec, efs, o);
}

// Also on two_level, whose factors are summed in the host first (the bound holds for any order
// of the float32 sums).
TEST(LowRank, MatchesFloat64ComputationOfTheSameSteps) {
  for (const Algorithm alg : {Algorithm::low_rank, Algorithm::two_level}) {
    SCOPED_TRACE(algorithm_name(alg));
    const Codec codec("powersgd:rank=3,warm_start=false");
    // A 40 x 24 matrix (rank 3: 64 x 3 x 2 <= 960), a 1-D tensor and a 6 x 5 matrix below the
    // rate (11 x 3 x 2 > 30): the last two go dense in the same collective.
    Tensors t = random_tensors({{40, 24}, {50, 1}, {6, 5}}, 1);
    const Tensors before = t;
    const auto q0 = first_q(11, 0, 24 * 3);
    const Reference ref = reference_step(before.data[0], 40, 24, 3, q0);
    run(t, codec, {}, explicit_low_rank(11, alg));
    EXPECT_EQ(world().last_stats().algorithm, alg);
    double err = 0, norm = 0;
    for (std::size_t i = 0; i < ref.out.size(); ++i) {
      err += (t.data[0][i] - ref.out[i]) * (t.data[0][i] - ref.out[i]);
      norm += ref.out[i] * ref.out[i];
    }
    err = std::sqrt(err);
    EXPECT_LE(err, ref.bound) << "||out|| " << std::sqrt(norm);
    // The bound means something: far below the result itself (a wrong step is off by about it).
    EXPECT_LT(ref.bound, 1e-2 * std::sqrt(norm));
    if (rank() == 0) {
      std::printf("[ low_rank ] ||out - float64|| %.3g, bound %.3g, ||out|| %.3g\n", err, ref.bound,
                  std::sqrt(norm));
    }
    // The dense ones: the float32 sum, within (W - 1) u sum_r |x_r| of the exact one.
    for (std::size_t k = 1; k < 3; ++k) {
      const std::vector<float> all = gather(before.data[k]);
      const std::size_t n = before.data[k].size();
      for (std::size_t i = 0; i < n; ++i) {
        double exact = 0, mag = 0;
        for (int w = 0; w < size(); ++w) {
          exact += all[w * n + i];
          mag += std::fabs(all[w * n + i]);
        }
        ASSERT_LE(std::fabs(t.data[k][i] - exact), (size() - 1) * kU * mag + 1e-30)
            << k << " " << i;
      }
    }
    EXPECT_TRUE(test::same_on_all_ranks(t.data[0]));
  }
}

TEST(LowRank, AverageDividesTheResultBySize) {
  const Codec codec("powersgd:rank=2");
  Tensors a = random_tensors({{30, 20}, {20, 1}}, 2);
  Tensors b = a;
  BucketOptions o = explicit_low_rank();
  run(a, codec, {}, o);
  o.allreduce.average = true;
  run(b, codec, {}, o);
  for (std::size_t k = 0; k < 2; ++k) {
    for (std::size_t i = 0; i < a.data[k].size(); ++i) {
      // Both from the same float64 value: s / W rounded, and s rounded then divided.
      EXPECT_NEAR(b.data[k][i], a.data[k][i] / size(), 2 * kU * std::fabs(a.data[k][i]) + 1e-30);
    }
  }
}

// result + residuals = inputs, summed over steps and ranks. Per step and element the library
// rounds M = x + e (u |M_r|), the share s / W and M - share (u |e_r| each, the share's error
// counted W times: u |s|), the output (u |s|), and the dense tensors' float32 sum ((W - 1) u sum
// |M_r|): at most (W + 1) u sum_r |M_r| + u sum_r |e_r| + 2 u |out| + float64's own rounding.
TEST(LowRank, ConservesWithErrorFeedback) {
  for (const Algorithm alg : {Algorithm::low_rank, Algorithm::two_level}) {
    SCOPED_TRACE(algorithm_name(alg));
    const Codec codec("powersgd:rank=2");
    const std::vector<MatrixShape> shapes = {{30, 20}, {50, 1}, {4, 4}};
    std::vector<ErrorFeedback> efs;
    for (const auto& s : shapes) efs.emplace_back(s.rows * s.cols);
    std::vector<ErrorFeedback*> ptrs;
    for (auto& e : efs) ptrs.push_back(&e);
    std::size_t total = 0;
    for (const auto& s : shapes) total += s.rows * s.cols;
    std::vector<double> inputs(total, 0.0), outputs(total, 0.0), bound(total, 0.0);
    for (int step = 0; step < 30; ++step) {
      Tensors t = random_tensors(shapes, 100 + step);
      std::vector<double> local(2 * total);
      std::size_t at = 0;
      for (std::size_t k = 0; k < shapes.size(); ++k) {
        const auto e = efs[k].residual();
        for (std::size_t i = 0; i < t.data[k].size(); ++i, ++at) {
          local[at] = t.data[k][i];
          local[total + at] = std::fabs(t.data[k][i] + e[i]);
        }
      }
      BucketOptions o = explicit_low_rank(7 + step, alg);
      run(t, codec, ptrs, o);
      at = 0;
      for (std::size_t k = 0; k < shapes.size(); ++k) {
        const auto e = efs[k].residual();
        for (std::size_t i = 0; i < t.data[k].size(); ++i, ++at) {
          local[total + at] = (size() + 1) * kU * local[total + at] + kU * std::fabs(e[i]);
          outputs[at] += t.data[k][i];
          bound[at] += 2 * kU * std::fabs(t.data[k][i]);
        }
      }
      const std::vector<double> all = sum_double(local);
      for (std::size_t i = 0; i < total; ++i) {
        inputs[i] += all[i];
        bound[i] += all[total + i];
      }
    }
    std::vector<double> residuals(total);
    std::size_t at = 0;
    for (auto& e : efs) {
      for (float v : e.residual()) residuals[at++] = v;
    }
    const std::vector<double> left = sum_double(residuals);
    double worst = 0;
    for (std::size_t i = 0; i < total; ++i) {
      const double gap = std::fabs(inputs[i] - outputs[i] - left[i]);
      worst = std::max(worst, gap / (bound[i] * (1 + 1e-9) + 1e-300));
      ASSERT_LE(gap, bound[i] * (1 + 1e-9) + 1e-300) << "element " << i;
    }
    // The compressed matrix really left something behind (error feedback carried it).
    double kept = 0;
    for (std::size_t i = 0; i < 600; ++i) kept += std::fabs(left[i]);
    EXPECT_GT(kept, 1.0);
    // The dense tensors keep no residual.
    for (std::size_t k = 1; k < 3; ++k) {
      for (float v : efs[k].residual()) ASSERT_EQ(v, 0.0f);
    }
  }
}

// Every rank holds M / W for a fixed 64 x 48 M = U diag(s) V^T (U, V orthonormal), so the sum is
// M every step. The best rank-2 approximation leaves sqrt(sum_{i > 2} s_i^2). Warm start is a
// power iteration: its subspace error shrinks by s_3 / s_2 = 2/3 a step, to (2/3)^60 < 1e-10
// after 60 steps, so its error is the optimum to float32's precision. A cold start projects on
// the span of M Q for a fresh random Q every step: one power step from random, whose error
// stays well above the optimum.
struct Spectral {
  std::size_t rows = 64, cols = 48;
  std::vector<double> s = {8, 6, 4, 3, 2, 1, 0.5, 0.25};
  std::vector<double> m;  // the sum
  double optimum = 0;
  Spectral() {
    std::vector<double> u(rows * s.size()), v(cols * s.size()), R;
    std::uint64_t z = 12345;
    const auto next = [&] {
      z = z * 6364136223846793005ull + 1442695040888963407ull;
      return static_cast<double>(z >> 11) * 0x1p-53 - 0.5;
    };
    for (double& x : u) x = next();
    for (double& x : v) x = next();
    u = gram_schmidt(u, rows, s.size(), R);
    v = gram_schmidt(v, cols, s.size(), R);
    m.assign(rows * cols, 0.0);
    for (std::size_t i = 0; i < rows; ++i) {
      for (std::size_t k = 0; k < cols; ++k) {
        for (std::size_t j = 0; j < s.size(); ++j) {
          m[i * cols + k] += u[i * s.size() + j] * s[j] * v[k * s.size() + j];
        }
      }
    }
    for (std::size_t j = 2; j < s.size(); ++j) optimum += s[j] * s[j];
    optimum = std::sqrt(optimum);
  }
  // ||result - M||_F after `steps` calls.
  double error_after(const Codec& codec, int steps, bool with_state) {
    std::vector<float> mine(rows * cols);
    ErrorFeedback state(rows * cols);
    double err = 0;
    for (int step = 0; step < steps; ++step) {
      for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<float>(m[i] / size());
      Tensors t;
      t.data = {mine};
      t.shapes = {{rows, cols}};
      if (with_state) {
        // Warm start lives in the ErrorFeedback; its residual is cleared each step so that the
        // input stays M (this test is about Q, not about error feedback).
        run(t, codec, {&state}, explicit_low_rank(step + 1));
        std::fill(state.residual().begin(), state.residual().end(), 0.0f);
      } else {
        run(t, codec, {}, explicit_low_rank(step + 1));
      }
      err = 0;
      for (std::size_t i = 0; i < mine.size(); ++i) {
        err += (t.data[0][i] - m[i]) * (t.data[0][i] - m[i]);
      }
      err = std::sqrt(err);
    }
    return err;
  }
};

TEST(LowRank, WarmStartConvergesColdStartDoesNot) {
  Spectral sp;
  const double warm = sp.error_after(Codec("powersgd:rank=2"), 60, true);
  const double cold = sp.error_after(Codec("powersgd:rank=2,warm_start=false"), 60, true);
  const double stateless = sp.error_after(Codec("powersgd:rank=2"), 5, false);
  // Float32's part: about u ||M||_F per element pass, a few passes.
  EXPECT_LE(warm, sp.optimum * (1 + 1e-4) + 1e-4) << "optimum " << sp.optimum;
  EXPECT_GT(cold, sp.optimum * 1.01) << "optimum " << sp.optimum;
  // Without an ErrorFeedback there is nowhere to keep Q: every step starts cold.
  EXPECT_GT(stateless, sp.optimum * 1.01);
}

TEST(LowRank, AlternatingConvergesAndSendsOneFactorAStep) {
  Spectral sp;
  const double err = sp.error_after(Codec("powersgd:rank=2,alternate=true"), 120, true);
  EXPECT_LE(err, sp.optimum * (1 + 1e-4) + 1e-4) << "optimum " << sp.optimum;
  if (size() < 2) return;
  // Bytes: MPI_Allreduce's 2 (W-1)/W 4 k for k factor elements, and the agreement.
  const auto W = static_cast<std::uint64_t>(size());
  const auto volume = [&](std::uint64_t k) { return 2 * (W - 1) * 4 * k / W; };
  const std::uint64_t agreement = 2 * sizeof(detail::Agreement);
  ErrorFeedback state(64 * 48);
  Tensors t = random_tensors({{64, 48}}, 5);
  run(t, Codec("powersgd:rank=2,alternate=true"), {&state});
  EXPECT_EQ(world().last_stats().bytes_sent, volume(64 * 2) + agreement);  // P
  run(t, Codec("powersgd:rank=2,alternate=true"), {&state});
  EXPECT_EQ(world().last_stats().bytes_sent, volume(48 * 2) + agreement);  // then Q
  run(t, Codec("powersgd:rank=2"), {&state});
  EXPECT_EQ(world().last_stats().bytes_sent, volume(64 * 2) + volume(48 * 2) + agreement);
}

TEST(LowRank, Fp16FactorsSendAboutHalf) {
  if (size() < 2) GTEST_SKIP() << "nothing is sent on one rank";
  Tensors a = random_tensors({{512, 256}}, 6);
  Tensors b = a;
  run(a, Codec("powersgd:rank=4"));
  const std::uint64_t fp32 = world().last_stats().bytes_sent;
  run(b, Codec("powersgd:rank=4,values=fp16"));
  const std::uint64_t fp16 = world().last_stats().bytes_sent;
  // Half, plus each payload's header (under 64 bytes) per chunk and exchange, and the agreement.
  EXPECT_LE(fp16, fp32 / 2 + 4 * 64 * static_cast<std::uint64_t>(size()) + 192);
  // And the result close to the float32 factors' (binary16 keeps 11 bits).
  double d = 0, n = 0;
  for (std::size_t i = 0; i < a.data[0].size(); ++i) {
    d += (a.data[0][i] - b.data[0][i]) * (a.data[0][i] - b.data[0][i]);
    n += a.data[0][i] * a.data[0][i];
  }
  EXPECT_LT(std::sqrt(d / n), 0.01);
  EXPECT_TRUE(test::same_on_all_ranks(b.data[0]));
}

TEST(LowRank, StartStepsGoDense) {
  const Codec codec("powersgd:rank=1,start=2");
  ErrorFeedback ef(30 * 20);
  for (int step = 0; step < 3; ++step) {
    Tensors t = random_tensors({{30, 20}}, 40 + step);
    const std::vector<float> exact = test::mpi_sum(t.data[0]);
    run(t, codec, {&ef});
    double d = 0;
    for (std::size_t i = 0; i < exact.size(); ++i)
      d = std::max<double>(d, std::fabs(t.data[0][i] - exact[i]));
    if (step < 2) {
      // Dense: the float32 sum (MPI's order either way), and nothing left behind.
      EXPECT_LT(d, 1e-4) << step;
      for (float v : ef.residual()) ASSERT_EQ(v, 0.0f);
    } else {
      EXPECT_GT(d, 0.1) << "rank 1 of a random 30 x 20 sum is far from it";
    }
  }
}

// Rank r runs at SIMD level r mod 3 (avx512, avx2, baseline, each capped by the CPU): the
// products, the orthonormalization and the fp16 factors must not depend on it.
TEST(LowRank, IdenticalAcrossSimdLevels) {
  const detail::SimdLevel levels[3] = {detail::SimdLevel::avx512, detail::SimdLevel::avx2,
                                       detail::SimdLevel::baseline};
  detail::set_simd_level(levels[rank() % 3]);
  std::printf("[ low_rank ] rank %d at SIMD level %s\n", rank(),
              std::string(detail::simd_level_name(detail::simd_level())).c_str());
  for (const char* spec :
       {"powersgd:rank=4", "powersgd:rank=2,values=fp16", "powersgd:rank=3,alternate=true"}) {
    std::vector<ErrorFeedback> efs;
    efs.emplace_back(96 * 70);
    efs.emplace_back(33);
    for (int step = 0; step < 3; ++step) {
      Tensors t = random_tensors({{96, 70}, {33, 1}}, 60 + step);
      run(t, Codec(spec), {&efs[0], &efs[1]});
      EXPECT_TRUE(test::same_on_all_ranks(t.data[0])) << spec << " step " << step;
      EXPECT_TRUE(test::same_on_all_ranks(t.data[1])) << spec << " step " << step;
    }
  }
  detail::set_simd_level(detail::SimdLevel::avx512);
}

TEST(LowRank, NeedsShapes) {
  const Codec codec("powersgd:rank=2");
  std::vector<float> x = test::input(600, 3);
  std::string msg;
  EXPECT_EQ(status_of([&] { world().allreduce(x, codec); }, &msg), Status::invalid_argument);
  EXPECT_NE(msg.find("allreduce_buckets with shapes"), std::string::npos) << msg;
  std::vector<std::span<float>> spans = {x};
  EXPECT_EQ(status_of([&] { world().allreduce_buckets(spans, codec); }), Status::invalid_argument);
  // Another algorithm for powersgd, or low_rank for another codec.
  Tensors t = random_tensors({{30, 20}}, 4);
  BucketOptions o = explicit_low_rank();
  o.allreduce.algorithm = Algorithm::dense;
  EXPECT_EQ(status_of([&] { run(t, codec, {}, o); }, &msg), Status::invalid_argument);
  EXPECT_NE(msg.find("runs only on low_rank"), std::string::npos) << msg;
  EXPECT_EQ(status_of([&] { run(t, Codec("qsgd")); }, &msg), Status::invalid_argument);
  // Still in step.
  run(t, codec);
}

TEST(LowRank, DisagreementsFailEveryRank) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks";
  // Another spec on one rank.
  Tensors t = random_tensors({{30, 20}}, 8);
  EXPECT_EQ(status_of([&] { run(t, Codec(rank() == 1 ? "powersgd:rank=4" : "powersgd:rank=2")); }),
            Status::mismatch);
  // The same sizes in other shapes.
  Tensors u = random_tensors({{30, 20}}, 9);
  if (rank() == 1) u.shapes[0] = {20, 30};
  EXPECT_EQ(status_of([&] { run(u, Codec("powersgd:rank=2")); }), Status::mismatch);
  // A shape that does not fit its tensor on one rank: that rank's invalid_argument, the others'
  // mismatch.
  Tensors v = random_tensors({{30, 20}}, 10);
  if (rank() == 1) v.shapes[0] = {30, 21};
  const Status s = status_of([&] { run(v, Codec("powersgd:rank=2")); });
  EXPECT_EQ(s, rank() == 1 ? Status::invalid_argument : Status::mismatch);
  // Still in step, and the states agreed again: one rank's fresh ErrorFeedback makes every rank
  // start afresh (the same bits everywhere).
  std::vector<ErrorFeedback> efs;
  efs.emplace_back(600);
  for (int step = 0; step < 3; ++step) {
    if (step == 2 && rank() == 0) efs[0] = ErrorFeedback(600);
    Tensors w = random_tensors({{30, 20}}, 11 + step);
    run(w, Codec("powersgd:rank=2"), {&efs[0]});
    EXPECT_TRUE(test::same_on_all_ranks(w.data[0])) << step;
  }
}

// Auto weighs low_rank against the uncompressed allreduce with the model's terms (FixedTiming:
// 2 ns per element and rank a product, 1 ns the reconstruction). A 256 x 256 matrix at rank 4:
// three passes, 65536 x 4 x (2 x 2 + 1) ns = 1.3 ms, against a ring allreduce of its 256 KiB:
// at 10 Gbit 2 (P-1)/P 262144 x 0.8 ns <= 0.42 ms, so the uncompressed call wins; at 100 Mbit
// 80 ns a byte makes that >= 21 ms at 2 ranks, and low_rank (its factors 4 KiB) wins.
TEST(LowRank, AutoSendsUncompressedWhereThatIsFaster) {
  if (size() < 2) GTEST_SKIP() << "one rank sends nothing either way";
  const Codec codec("powersgd:rank=4");
  BucketOptions o;
  o.dense_below = 0;
  Tensors t = random_tensors({{256, 256}}, 13);
  run(t, codec, {}, o);  // on 10 Gbit (world())
  EXPECT_FALSE(world().last_stats().compressed);
  EXPECT_EQ(world().last_stats().algorithm, Algorithm::dense);
  const auto made =
      test::make_communicator(network_for_rate(1e8, 20e-6), std::make_shared<test::FixedTiming>());
  Communicator& slow = *made;
  Tensors u = random_tensors({{256, 256}}, 14);
  run(u, codec, {}, o, slow);
  EXPECT_TRUE(slow.last_stats().compressed);
  EXPECT_EQ(slow.last_stats().algorithm, Algorithm::low_rank);
}

// The C API's shaped form gives the C++ one's result.
TEST(LowRank, CApiShaped) {
  Tensors t = random_tensors({{30, 20}, {20, 1}}, 12);
  Tensors cpp = t;
  BucketOptions o;
  o.allreduce.seed = 5;
  o.allreduce.allow_uncompressed = false;
  world().allreduce_buckets(cpp.spans(), cpp.shapes, Codec("powersgd:rank=2"), {}, o);
  gcomp_codec codec = nullptr;
  ASSERT_EQ(gcomp_codec_create("powersgd:rank=2", &codec), GCOMP_OK);
  float* ptrs[2] = {t.data[0].data(), t.data[1].data()};
  const std::size_t rows[2] = {30, 20}, cols[2] = {20, 1};
  ASSERT_EQ(gcomp_allreduce_buckets_shaped(ptrs, rows, cols, 2, codec, nullptr, 5, MPI_COMM_WORLD),
            GCOMP_OK)
      << gcomp_last_error();
  EXPECT_EQ(t.data[0], cpp.data[0]);
  EXPECT_EQ(t.data[1], cpp.data[1]);
  gcomp_stats st;
  ASSERT_EQ(gcomp_last_stats(&st), GCOMP_OK);
  EXPECT_STREQ(st.algorithm, "dense");  // the last bucket: the small 1-D tensor, summed dense
  // A NULL tensor on rank 0: INVALID_ARGUMENT there, MISMATCH on the others, nobody waits.
  float* holes[2] = {nullptr, t.data[1].data()};
  const gcomp_status s = gcomp_allreduce_buckets_shaped(rank() == 0 ? holes : ptrs, rows, cols, 2,
                                                        codec, nullptr, 5, MPI_COMM_WORLD);
  EXPECT_EQ(s, rank() == 0 ? GCOMP_ERR_INVALID_ARGUMENT : GCOMP_ERR_MISMATCH);
  gcomp_codec_destroy(codec);
}

}  // namespace
}  // namespace gcomp
