// Every algorithm against references computed with plain MPI from each rank's decoded
// contribution: the reducing algorithms equal MPI_Allreduce's sum up to summation order, the
// allgather paths equal the rank-ordered sum exactly, and with integer-valued inputs (every sum
// exact) all of them equal MPI_Allreduce bit for bit. compressed_reduce_scatter re-encodes, so
// it is checked for unbiasedness instead.
#include <algorithm>
#include <bit>
#include <cmath>

#include "gcomp/cost_model.hpp"
#include "mpi_util.hpp"

namespace gcomp {
namespace {

using test::rank;
using test::size;
using test::world;

struct Case {
  const char* spec;
  Algorithm algorithm;
};

// Every algorithm with the codecs it suits (compressed_reduce_scatter: see its own tests).
const Case kCases[] = {
    {"none", Algorithm::dense},
    {"none", Algorithm::allgather},
    {"fp16", Algorithm::dense},
    {"bf16", Algorithm::allgather},
    {"qsgd", Algorithm::dense},
    {"qsgd:bits=3,bucket=100", Algorithm::allgather},
    {"terngrad", Algorithm::allgather},
    {"sign", Algorithm::dense},
    {"sign", Algorithm::allgather},
    {"topk:ratio=0.01", Algorithm::dense},
    {"topk:ratio=0.01", Algorithm::sparse_allgather},
    {"topk:ratio=0.01", Algorithm::sparse_recursive_doubling},
    {"topk:ratio=0.01", Algorithm::sparse_split},
    {"topk:ratio=0.3,values=fp16", Algorithm::sparse_recursive_doubling},
    {"topk:ratio=0.3", Algorithm::sparse_split},
    {"randomk:ratio=0.05", Algorithm::sparse_recursive_doubling},
    {"randomk:ratio=0.05,scale=true", Algorithm::sparse_split},
    {"threshold:tau=1.5", Algorithm::sparse_allgather},
    {"threshold:tau=1.5", Algorithm::sparse_recursive_doubling},
    {"threshold:tau=0.5", Algorithm::sparse_split},
};

bool gathers(Algorithm a) { return a == Algorithm::allgather || a == Algorithm::sparse_allgather; }

void check_case(const Case& c, std::size_t n, bool in_place, std::uint32_t seed) {
  const Codec codec(c.spec);
  const auto x = test::input(n, seed);
  const auto mine = test::contribution(codec, x, seed);
  const auto ref = test::mpi_sum(mine);
  const auto tol = test::order_tolerance(mine);
  AllreduceOptions opt;
  opt.algorithm = c.algorithm;
  opt.seed = seed;
  std::vector<float> out(n, -7.0f);
  if (in_place) {
    out = x;
    world().allreduce(out, codec, nullptr, opt);
  } else {
    world().allreduce(x, out, codec, nullptr, opt);
  }
  EXPECT_EQ(world().last_stats().algorithm, c.algorithm);
  const std::string what = std::string(c.spec) + " " + algorithm_name(c.algorithm) +
                           " n=" + std::to_string(n) + (in_place ? " in place" : "");
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) bad += !(std::fabs(out[i] - ref[i]) <= tol[i]);
  EXPECT_EQ(bad, 0u) << what;
  if (gathers(c.algorithm)) EXPECT_EQ(out, test::ordered_sum(mine)) << what;
  EXPECT_TRUE(test::same_on_all_ranks(out)) << what;
}

TEST(Allreduce, EveryAlgorithmMatchesTheReference) {
  std::uint32_t seed = 1;
  for (const Case& c : kCases) {
    for (std::size_t n : {0u, 1u, 17u, 10007u}) check_case(c, n, false, seed++);
  }
}

TEST(Allreduce, InPlace) {
  std::uint32_t seed = 100;
  for (const Case& c : kCases) check_case(c, 4099, true, seed++);
}

TEST(Allreduce, OddMillions) {
  std::uint32_t seed = 200;
  for (const Case& c : {Case{"none", Algorithm::dense}, Case{"qsgd", Algorithm::allgather},
                        Case{"topk:ratio=0.01", Algorithm::sparse_recursive_doubling},
                        Case{"topk:ratio=0.01", Algorithm::sparse_split},
                        Case{"topk:ratio=0.001", Algorithm::sparse_allgather}}) {
    check_case(c, 1000003, false, seed++);
  }
}

// Densities from 0.01% to 100% through the sparse algorithms (the dense switch included).
TEST(Allreduce, Densities) {
  std::uint32_t seed = 300;
  for (const char* ratio : {"0.0001", "0.01", "0.1", "0.5", "1"}) {
    const std::string spec = std::string("topk:ratio=") + ratio;
    for (Algorithm a : {Algorithm::sparse_allgather, Algorithm::sparse_recursive_doubling,
                        Algorithm::sparse_split}) {
      check_case({spec.c_str(), a}, 100003, false, seed++);
    }
  }
}

// With integer values every sum is exact, so every algorithm equals MPI_Allreduce bit for bit.
TEST(Allreduce, ExactOnIntegerValues) {
  for (const Case& c : kCases) {
    const Codec codec(c.spec);
    if (codec.kind() != CodecKind::none && !codec.properties().sparse) continue;
    if (std::string(c.spec).find("scale=true") != std::string::npos) continue;
    const auto x = test::integers(20011, 5);
    const auto ref = test::mpi_sum(test::contribution(codec, x, 9));
    AllreduceOptions opt;
    opt.algorithm = c.algorithm;
    opt.seed = 9;
    std::vector<float> out(x.size());
    world().allreduce(x, out, codec, nullptr, opt);
    EXPECT_EQ(out, ref) << c.spec << " " << algorithm_name(c.algorithm);
  }
}

// Recursive doubling turns its stream dense once the merged entries would take more bytes:
// with 45% of n per rank, (index + value) pairs cost 3.6n bytes; after one merge the union,
// ~70% of n, would cost 5.6n > 4n, so every later round sends at most 4n + 8 bytes.
TEST(Allreduce, RecursiveDoublingSwitchesToDense) {
  const std::size_t n = 200000;
  const Codec codec("topk:ratio=0.45");
  const auto x = test::input(n, 77);
  AllreduceOptions opt;
  opt.algorithm = Algorithm::sparse_recursive_doubling;
  std::vector<float> out(n);
  world().allreduce(x, out, codec, nullptr, opt);
  const auto ref = test::mpi_sum(test::contribution(codec, x, 0));
  const auto tol = test::order_tolerance(test::contribution(codec, x, 0));
  for (std::size_t i = 0; i < n; ++i) ASSERT_LE(std::fabs(out[i] - ref[i]), tol[i]);
  if (size() == 4) {
    // Two rounds: 3.6n + 8, then at most 4n + 8 (a sparse second round would send ~5.6n).
    const double sent = static_cast<double>(world().last_stats().bytes_sent);
    EXPECT_LE(sent, 3.6 * n + 4.0 * n + 200) << sent / n << " bytes per element";
  }
}

TEST(Allreduce, AverageDividesBySize) {
  const Codec codec("topk:ratio=0.1");
  const auto x = test::input(5000, 8);
  const auto ref = test::mpi_sum(test::contribution(codec, x, 3));
  const auto tol = test::order_tolerance(test::contribution(codec, x, 3));
  for (Algorithm a : {Algorithm::dense, Algorithm::sparse_split, Algorithm::sparse_allgather}) {
    AllreduceOptions opt;
    opt.algorithm = a;
    opt.average = true;
    opt.seed = 3;
    std::vector<float> out(x.size());
    world().allreduce(x, out, codec, nullptr, opt);
    for (std::size_t i = 0; i < x.size(); ++i) {
      ASSERT_NEAR(out[i], ref[i] / static_cast<float>(size()), tol[i] + 1e-6f * std::fabs(ref[i]));
    }
  }
}

TEST(Allreduce, MajorityVote) {
  const Codec codec("sign");
  const auto x = test::input(3001, 9);
  AllreduceOptions opt;
  opt.majority_vote = true;
  std::vector<float> out(x.size());
  world().allreduce(x, out, codec, nullptr, opt);
  EXPECT_EQ(world().last_stats().algorithm, Algorithm::allgather);
  // Votes and scales from plain MPI.
  std::vector<int> vote(x.size()), votes(x.size());
  double scale = 0;
  for (float v : x) scale += std::fabs(v);
  scale /= static_cast<double>(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) vote[i] = x[i] < 0 ? -1 : 1;
  MPI_Allreduce(vote.data(), votes.data(), static_cast<int>(x.size()), MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  double scales = 0;
  MPI_Allreduce(&scale, &scales, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double want = votes[i] > 0 ? scales : (votes[i] < 0 ? -scales : 0.0);
    ASSERT_NEAR(out[i], want, 1e-5 * scales) << i;
  }
}

// auto runs what the cost model (corrected by the times of calls it has run) predicts cheapest,
// from the agreed numbers; the first call at a size follows the model alone.
TEST(Allreduce, AutoFollowsTheCostModel) {
  for (const char* spec : {"none", "fp16", "qsgd", "qsgd:bits=8", "terngrad", "sign",
                           "topk:ratio=0.01", "topk:ratio=0.001", "randomk:ratio=0.01"}) {
    const Codec codec(spec);
    for (std::size_t n : {1000u, 300000u}) {
      const auto x = test::input(n, 11);
      std::vector<float> out(n);
      world().allreduce(x, out, codec);
      const Algorithm ran = world().last_stats().algorithm;
      const Choice c = world().choose(codec, n);
      EXPECT_EQ(ran, c.algorithm) << spec << " n=" << n;
      EXPECT_EQ(world().last_stats().compressed, c.compressed) << spec << " n=" << n;
      // And with the codec always applied.
      AllreduceOptions applied;
      applied.allow_uncompressed = false;
      world().allreduce(x, out, codec, nullptr, applied);
      EXPECT_TRUE(world().last_stats().compressed);
      EXPECT_EQ(world().last_stats().algorithm, world().choose(codec, n, 0, false).algorithm);
      const auto t = world().predict(codec, n);
      EXPECT_TRUE(std::isfinite(t[static_cast<int>(ran)])) << spec;
    }
  }
  // `none` is always dense.
  EXPECT_EQ(world().choose(Codec("none"), 1 << 20).algorithm, Algorithm::dense);
}

// With allow_uncompressed, auto skips the codec exactly when the model says no compressing
// algorithm beats the plain allreduce; the result is then the exact sum of x + e.
// The first choice for a fresh (codec, size) is the model's own minimum.
TEST(Allreduce, FirstChoiceIsTheModelsMinimum) {
  const Codec codec("qsgd:bits=5,bucket=256");  // a spec no other test uses
  const std::size_t n = 77777;
  const auto x = test::input(n, 40);
  std::vector<float> out(n);
  AllreduceOptions applied;
  applied.allow_uncompressed = false;
  world().allreduce(x, out, codec, nullptr, applied);
  // Its own time is not learned until the next call's agreement: choose() is still the model's.
  const Choice c = world().choose(codec, n, 0, false);
  EXPECT_EQ(world().last_stats().algorithm, c.algorithm);
  const auto t = world().predict(codec, n);
  ModelInput in;
  for (int a = 1; a < kAlgorithmCount; ++a) {
    if (auto_candidate(static_cast<Algorithm>(a), in)) {
      EXPECT_GE(t[a], t[static_cast<int>(c.algorithm)]) << algorithm_name(static_cast<Algorithm>(a));
    }
  }
}

// auto explores (each plausible candidate in rounds) and then learns from the agreed times, so
// although every rank measures its own times, all ranks run the same algorithm on every call and
// end with the same bits.
TEST(Allreduce, AutoLearnsAlikeOnEveryRank) {
  const Codec codec("qsgd:bits=7,bucket=300");  // a spec no other test uses
  const std::size_t n = 20000;
  const auto x = test::input(n, 41);
  std::vector<float> out(n);
  std::vector<int> seen;
  for (int call = 0; call < 40; ++call) {
    AllreduceOptions opt;
    opt.seed = static_cast<std::uint64_t>(call) + 1;
    world().allreduce(x, out, codec, nullptr, opt);
    const int mine = static_cast<int>(world().last_stats().algorithm) * 2 +
                     (world().last_stats().compressed ? 1 : 0);
    int lo = 0;
    int hi = 0;
    MPI_Allreduce(&mine, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&mine, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    ASSERT_EQ(lo, hi) << "call " << call;
    std::uint32_t sum = 0;
    for (float v : out) sum = sum * 31u + std::bit_cast<std::uint32_t>(v);
    std::uint32_t smin = 0;
    std::uint32_t smax = 0;
    MPI_Allreduce(&sum, &smin, 1, MPI_UINT32_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&sum, &smax, 1, MPI_UINT32_T, MPI_MAX, MPI_COMM_WORLD);
    ASSERT_EQ(smin, smax) << "call " << call;
    if (std::find(seen.begin(), seen.end(), mine) == seen.end()) seen.push_back(mine);
  }
  // The model's first choice, then the others: more than one candidate ran.
  EXPECT_GE(seen.size(), 2u);
}

TEST(Allreduce, AutoMaySkipTheCodecWhenAllowed) {
  for (const char* spec : {"fp16", "qsgd", "sign", "topk:ratio=0.01", "topk:ratio=0.5"}) {
    const Codec codec(spec);
    for (std::size_t n : {1000u, 300000u}) {
      const auto x = test::integers(n, 12);
      AllreduceOptions opt;
      opt.allow_uncompressed = true;
      std::vector<float> out(n);
      world().allreduce(x, out, codec, nullptr, opt);
      const Choice want = world().choose(codec, n);
      EXPECT_EQ(world().last_stats().compressed, want.compressed) << spec << " n=" << n;
      EXPECT_EQ(world().last_stats().algorithm, want.algorithm) << spec << " n=" << n;
      if (!want.compressed) {
        EXPECT_EQ(out, test::mpi_sum(x)) << spec;
        EXPECT_TRUE(std::isfinite(world().predict_uncompressed(n)));
      }
      // With error feedback, an uncompressed call sends x + e exactly: the residual is zero.
      ErrorFeedback ef(n);
      world().allreduce(x, out, codec, &ef, opt);
      if (!world().last_stats().compressed) {
        for (float e : ef.residual()) ASSERT_EQ(e, 0.0f);
        EXPECT_EQ(out, test::mpi_sum(x)) << spec;
      }
    }
  }
}

// compressed_reduce_scatter is unbiased for unbiased codecs: the mean over seeds of its result
// approaches the sum of the inputs within a bound from QSGD's per-element variance.
TEST(CompressedReduceScatter, UnbiasedForQsgd) {
  const std::size_t n = 1000;
  const int p = size();
  const Codec codec("qsgd:bits=4,bucket=512");
  const auto x = test::input(n, 12);
  const auto sum = test::mpi_sum(x);
  // Per element bound of one result's variance: stage 1, each rank's quantization of its
  // chunk bucket: (norm_rb / s)^2 / 4; stage 2, the owner's quantization of the summed bucket,
  // whose norm is at most sum_r norm_rb (1 + sqrt(D_b) / s) (|Q(v)_i| <= |v_i| + norm / s).
  const double s = 7;
  std::vector<double> stage1(n, 0.0), bound2(n, 0.0);
  for (std::size_t c = 0; c < static_cast<std::size_t>(p); ++c) {
    const std::size_t lo = c * n / p, hi = (c + 1) * n / p;
    for (std::size_t b = lo; b < hi; b += 512) {
      const std::size_t e = std::min(hi, b + 512);
      double nb = 0;
      for (std::size_t i = b; i < e; ++i) nb += static_cast<double>(x[i]) * x[i];
      nb = std::sqrt(nb);
      const double grow = 1 + std::sqrt(static_cast<double>(e - b)) / s;
      for (std::size_t i = b; i < e; ++i) {
        stage1[i] = (nb / s) * (nb / s) / 4;
        bound2[i] = nb * grow;
      }
    }
  }
  std::vector<double> var1(n), norm_sum(n);
  MPI_Allreduce(stage1.data(), var1.data(), static_cast<int>(n), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(bound2.data(), norm_sum.data(), static_cast<int>(n), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  const int trials = 400;
  std::vector<double> mean(n, 0.0);
  AllreduceOptions opt;
  opt.algorithm = Algorithm::compressed_reduce_scatter;
  std::vector<float> out(n);
  for (int t = 0; t < trials; ++t) {
    opt.seed = 1000 + static_cast<std::uint64_t>(t);
    world().allreduce(x, out, codec, nullptr, opt);
    for (std::size_t i = 0; i < n; ++i) mean[i] += out[i];
  }
  double worst = 0, total = 0, total_var = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double var = var1[i] + (norm_sum[i] / s) * (norm_sum[i] / s) / 4;
    const double err = mean[i] / trials - sum[i];
    worst = std::max(worst, std::fabs(err) / (5.5 * std::sqrt(var / trials) + 1e-5));
    total += err * err;
    total_var += var / trials;
  }
  EXPECT_LE(worst, 1.0);
  EXPECT_LE(total, 1.5 * total_var);
  // And it is not trivially within the bound: the error of a single result is far larger.
  EXPECT_TRUE(test::same_on_all_ranks(out));
}

TEST(CompressedReduceScatter, SmallAndOddSizes) {
  for (std::size_t n : {0u, 1u, 3u, 17u, 1000003u}) {
    const Codec codec("qsgd:bits=8");
    const auto x = test::input(n, 13);
    const auto sum = test::mpi_sum(x);
    AllreduceOptions opt;
    opt.algorithm = Algorithm::compressed_reduce_scatter;
    std::vector<float> out(n);
    world().allreduce(x, out, codec, nullptr, opt);
    double err = 0, norm = 0;
    for (std::size_t i = 0; i < n; ++i) {
      err += (out[i] - sum[i]) * (out[i] - sum[i]);
      norm += sum[i] * sum[i];
    }
    // Two 8-bit QSGD stages: relative error well below 1 (each stage ~ sqrt(D)/s ~ 0.18).
    if (n > 100) EXPECT_LE(std::sqrt(err / norm), 0.5) << n;
    EXPECT_TRUE(test::same_on_all_ranks(out));
  }
}

// Error feedback through allreduce: with a fixed input per rank the mean of the results over T
// steps is sum_r x_r - sum_r e_r / T exactly (but for rounding), and top-k's residual stays
// bounded (a delta-contraction with delta = k/n: ||e|| <= q / (1 - q) ||x||, q = sqrt(1-delta)),
// so the mean converges to the dense sum.
TEST(ErrorFeedback, MeanOfResultsConvergesToTheDenseSum) {
  const std::size_t n = 2000;
  const Codec codec("topk:ratio=0.1");
  const auto x = test::input(n, 14);
  const auto sum = test::mpi_sum(x);
  for (Algorithm a : {Algorithm::sparse_recursive_doubling, Algorithm::sparse_split,
                      Algorithm::dense}) {
    ErrorFeedback ef(n);
    AllreduceOptions opt;
    opt.algorithm = a;
    std::vector<double> mean(n, 0.0);
    std::vector<float> out(n);
    const int steps = 200;
    for (int t = 0; t < steps; ++t) {
      world().allreduce(x, out, codec, &ef, opt);
      for (std::size_t i = 0; i < n; ++i) mean[i] += out[i];
    }
    std::vector<float> e(ef.residual().begin(), ef.residual().end());
    const auto esum = test::mpi_sum(e);
    double err = 0, enorm = 0, snorm = 0, xnorm = 0, xmax = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const double d = mean[i] / steps - sum[i];
      err += d * d;
      enorm += static_cast<double>(esum[i]) * esum[i];
      snorm += static_cast<double>(sum[i]) * sum[i];
      xnorm += static_cast<double>(x[i]) * x[i];
    }
    err = std::sqrt(err);
    xnorm = std::sqrt(xnorm);
    MPI_Allreduce(&xnorm, &xmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    // The identity, up to float rounding of 200 steps.
    EXPECT_NEAR(err, std::sqrt(enorm) / steps, 1e-3 * std::sqrt(snorm)) << algorithm_name(a);
    const double q = std::sqrt(1 - 0.1);
    EXPECT_LE(std::sqrt(enorm), size() * q / (1 - q) * xmax * 1.01) << algorithm_name(a);
    EXPECT_LE(err / std::sqrt(snorm), 0.1) << algorithm_name(a);
  }
}

}  // namespace
}  // namespace gcomp
