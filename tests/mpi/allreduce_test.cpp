// Every algorithm against references computed with plain MPI from each rank's decoded
// contribution: the reducing algorithms equal MPI_Allreduce's sum up to summation order, the
// allgather paths equal the rank-ordered sum exactly, and with integer-valued inputs (every sum
// exact) all of them equal MPI_Allreduce bit for bit. compressed_reduce_scatter re-encodes, so
// it is checked for unbiasedness instead.
#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <thread>

#include "auto_choice.hpp"
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
    {"topk:ratio=0.01,chunk=4096,bits=2", Algorithm::sparse_allgather},
    {"topk:ratio=0.05,chunk=64,bits=3", Algorithm::sparse_recursive_doubling},
    {"topk:ratio=0.05,chunk=64,bits=3", Algorithm::sparse_split},
    {"topk:k=3,chunk=100,values=fp16", Algorithm::sparse_recursive_doubling},
    {"topk:ratio=0.02,chunk=512,bits=1", Algorithm::allgather},
    {"topk:ratio=0.02,chunk=512,bits=1", Algorithm::dense},
};

bool gathers(Algorithm a) { return a == Algorithm::allgather || a == Algorithm::sparse_allgather; }

// Whether the algorithm's streams carry the sums as binary16 (a codec with values=fp16 through
// an algorithm that exchanges partial sums).
bool half_sums(const Case& c) {
  const bool streams = c.algorithm == Algorithm::sparse_recursive_doubling ||
                       c.algorithm == Algorithm::sparse_split ||
                       c.algorithm == Algorithm::sparse_reduce_scatter;
  return streams && std::string(c.spec).find("values=fp16") != std::string::npos;
}

void check_case(const Case& c, std::size_t n, bool in_place, std::uint32_t seed) {
  const Codec codec(c.spec);
  const auto x = test::input(n, seed);
  const auto mine = test::contribution(codec, x, seed);
  const auto ref = test::mpi_sum(mine);
  auto tol = test::order_tolerance(mine);
  if (half_sums(c)) {
    // Each partial sum sent is rounded to binary16: at most half an ulp (2^-11 of it, or 2^-25
    // below the normal range) per rounding, partial sums bounded by the sum of |contributions|,
    // and at most ceil(log2 P) + 2 roundings on any path (recursive doubling's rounds, its fold).
    std::vector<float> a(mine.size());
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = std::fabs(mine[i]);
    const auto abs_sum = test::mpi_sum(a);
    const float rounds = std::ceil(std::log2(static_cast<float>(size()))) + 2;
    for (std::size_t i = 0; i < tol.size(); ++i) {
      tol[i] += rounds * (abs_sum[i] * 0x1p-11f + 0x1p-25f);
    }
  }
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
    // B-bit codes decode to a code times a float scale: no integers, so the order of the sum
    // shows (from 5 ranks on); the other tests bound those sums.
    if (std::string(c.spec).find("bits=") != std::string::npos) continue;
    auto x = test::integers(20011, 5);
    // binary16 sums are exact integers up to 2048: at most 5 ranks of [-400, 400].
    if (half_sums(c)) {
      for (float& v : x) v = std::round(v * 0.4f);
    }
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
    // The sum is within tol of ref (another order); times fl(1/P), rounded: two more roundings
    // of u = 2^-24; the test's ref / P one more.
    const double u = 0x1p-24;
    const double p = size();
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double bound = ((1 + 4 * u) * tol[i] + 3 * u * std::fabs(ref[i])) / p;
      ASSERT_NEAR(out[i], ref[i] / static_cast<float>(size()), bound);
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
  MPI_Allreduce(vote.data(), votes.data(), static_cast<int>(x.size()), MPI_INT, MPI_SUM,
                MPI_COMM_WORLD);
  double scales = 0;
  MPI_Allreduce(&scale, &scales, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double want = votes[i] > 0 ? scales : (votes[i] < 0 ? -scales : 0.0);
    // Each rank's scale is its double mean (n 2^-53 relative, < 1e-12) rounded to float once,
    // summed in double and rounded to float once more.
    ASSERT_NEAR(out[i], want, (2 * 0x1p-24 + 1e-12) * scales) << i;
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
      EXPECT_GE(t[a], t[static_cast<int>(c.algorithm)])
          << algorithm_name(static_cast<Algorithm>(a));
    }
  }
}

// auto explores (each plausible candidate in rounds) and then learns from the agreed times, so
// although every rank measures its own times, all ranks run the same algorithm on every call and
// end with the same bits. The times are given: each rank's differ a little, and the model's
// favourite takes three times what the model predicts, so the learned choice is another one.
class SkewedTiming : public test::FixedTiming {
 public:
  explicit SkewedTiming(Choice favourite) : favourite_(favourite) {}
  double call_seconds(const Codec& codec, std::size_t n, Choice ran, double) override {
    return truth(codec, n, ran) * (1 + 1e-3 * rank());
  }
  double truth(const Codec& codec, std::size_t n, Choice c) const {
    const bool fav = c.algorithm == favourite_.algorithm && c.compressed == favourite_.compressed;
    return predicted(codec, n, c) * (fav ? 3 : 1);
  }

 private:
  Choice favourite_;
};

TEST(Allreduce, AutoLearnsAlikeOnEveryRank) {
  const Codec codec("qsgd:bits=7,bucket=300");
  const std::size_t n = 20000;
  // The favourite is the model's minimum (what a fresh communicator runs first).
  const Choice favourite = world().choose(codec, n);
  const auto timing = std::make_shared<SkewedTiming>(favourite);
  const auto made = test::make_communicator(test::test_network(), timing);
  Communicator& comm = *made;
  ASSERT_EQ(comm.choose(codec, n).algorithm, favourite.algorithm);
  // The options auto weighs, and those it explores: predicted within 2x the best + 1 ms.
  std::vector<Choice> options = {{Algorithm::dense, false}};
  for (int a = 1; a < kAlgorithmCount; ++a) {
    if (std::isfinite(comm.predict(codec, n)[a]))
      options.push_back({static_cast<Algorithm>(a), true});
  }
  double best_predicted = kNotApplicable;
  for (Choice c : options)
    best_predicted = std::min(best_predicted, timing->predicted(codec, n, c));
  // Explored: within 2x (+ 1 ms) of the best prediction, or of the best measured time of what was
  // explored where that is higher (the favourite measures 3x its prediction): to a fixed point.
  std::vector<int> plausible;
  int truth_best = -1;
  double truth_best_seconds = kNotApplicable;
  for (double base = best_predicted, next = base;; base = next) {
    plausible.clear();
    for (Choice c : options) {
      if (timing->predicted(codec, n, c) > 2 * base + 1e-3) continue;
      const int id = static_cast<int>(c.algorithm) * 2 + (c.compressed ? 1 : 0);
      plausible.push_back(id);
      if (timing->truth(codec, n, c) < truth_best_seconds) {
        truth_best_seconds = timing->truth(codec, n, c);
        truth_best = id;
      }
    }
    // (as the learner has it: the agreed MAX of the ranks' skewed times)
    next = std::max(best_predicted, truth_best_seconds * (1 + 1e-3 * (size() - 1)));
    if (next == base) break;
  }
  ASSERT_GE(plausible.size(), 2u) << "the test needs two plausible options";

  const auto x = test::input(n, 41);
  std::vector<float> out(n);
  std::vector<int> seen;
  const int explore = 3 * static_cast<int>(plausible.size());
  int off_best = 0;
  const int calls = explore + 20;
  for (int call = 0; call < calls; ++call) {
    AllreduceOptions opt;
    opt.seed = static_cast<std::uint64_t>(call) + 1;
    comm.allreduce(x, out, codec, nullptr, opt);
    const int mine =
        static_cast<int>(comm.last_stats().algorithm) * 2 + (comm.last_stats().compressed ? 1 : 0);
    int lo = 0;
    int hi = 0;
    MPI_Allreduce(&mine, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&mine, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    ASSERT_EQ(lo, hi) << "call " << call;
    EXPECT_TRUE(test::same_on_all_ranks(out)) << "call " << call;
    if (call == 0) {
      EXPECT_EQ(comm.last_stats().algorithm, favourite.algorithm);
      EXPECT_EQ(comm.last_stats().compressed, favourite.compressed);
    }
    if (std::find(seen.begin(), seen.end(), mine) == seen.end()) seen.push_back(mine);
    if (call >= explore && mine != truth_best) ++off_best;
  }
  // Every plausible option ran (and nothing else); after that, the fastest by the given times,
  // apart from the one recheck in every 32 runs and, where another option's time is within
  // 10% of the best's, one in every 8 (20 calls: at most 2 + 1).
  std::sort(seen.begin(), seen.end());
  std::sort(plausible.begin(), plausible.end());
  EXPECT_EQ(seen, plausible);
  EXPECT_LE(off_best, 3);
}

// What the default Timing's call_seconds is given (what auto learns, collectives/planning/auto_choice.hpp
// learned_cost): with sleeping waits, the wall time, which a call that waits 300 ms for a late
// rank takes (at least 150 of them past the barrier's skew); with yielding ones, the thread's CPU
// time, never more than the test's own thread clock measures around the call.
class SeenTiming : public test::FixedTiming {
 public:
  double call_seconds(const Codec& codec, std::size_t n, Choice ran, double seconds) override {
    seen = seconds;
    return FixedTiming::call_seconds(codec, n, ran, seconds);
  }
  double seen = -1;
};

TEST(Allreduce, AutoLearnsTheWallWhereWaitsSleepAndTheCpuWhereTheyYield) {
  if (size() < 2) GTEST_SKIP() << "needs a rank to wait for";
  const auto timing = std::make_shared<SeenTiming>();
  const auto made = test::make_communicator(test::test_network(), timing);
  Communicator& comm = *made;
  const Codec codec("qsgd:bits=4");
  const auto x = test::input(4096, 3);
  std::vector<float> out(x.size());
  for (const WaitPolicy p : {WaitPolicy::sleep, WaitPolicy::yield}) {
    set_wait_policy(p);
    comm.allreduce(x, out, codec);  // settled: no measuring of the codec in the timed call
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const double w0 = MPI_Wtime();
    const double c0 = detail::thread_cpu_seconds();
    comm.allreduce(x, out, codec);
    const double cpu = detail::thread_cpu_seconds() - c0;
    const double wall = MPI_Wtime() - w0;
    EXPECT_GE(timing->seen, 0) << wait_policy_name(p);
    EXPECT_LE(timing->seen, wall + 1e-6) << wait_policy_name(p);
    if (p == WaitPolicy::sleep && rank() != 0) EXPECT_GE(timing->seen, 0.15);
    if (p == WaitPolicy::yield && num_threads() == 1) EXPECT_LE(timing->seen, cpu + 1e-6);
  }
  set_wait_policy(WaitPolicy::automatic);
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
  std::vector<double> stage1(n, 0.0), bound2(n, 0.0), step1(n, 0.0);
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
        step1[i] = nb / s;
      }
    }
  }
  std::vector<double> var1(n), norm_sum(n), steps1(n);
  MPI_Allreduce(stage1.data(), var1.data(), static_cast<int>(n), MPI_DOUBLE, MPI_SUM,
                MPI_COMM_WORLD);
  MPI_Allreduce(bound2.data(), norm_sum.data(), static_cast<int>(n), MPI_DOUBLE, MPI_SUM,
                MPI_COMM_WORLD);
  MPI_Allreduce(step1.data(), steps1.data(), static_cast<int>(n), MPI_DOUBLE, MPI_SUM,
                MPI_COMM_WORLD);
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
    // Besides the 5.5 sigma of the mean: each stage's 16-bit draws realise its probabilities to
    // 2^-16 of a step (the ranks' steps in stage 1, at most norm_sum / s in stage 2), and the
    // float arithmetic (the decodes' three rounded factors, the quotient behind each
    // probability, the sums in float of P + 1 terms) is off by at most (P + 8) u of the values
    // and steps involved, u = 2^-24.
    const double units = steps1[i] + norm_sum[i] / s;
    const double slack = units * 0x1p-16 + (p + 8) * 0x1p-24 * (std::fabs(sum[i]) + units);
    worst = std::max(worst, std::fabs(err) / (5.5 * std::sqrt(var / trials) + slack));
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
    // Two 8-bit QSGD stages (s = 127, D = 512), each adding at most omega = min(D / s^2,
    // sqrt(D) / s) = 0.032 of its input's squared norm in expectation: E err^2 <= omega (2 +
    // omega) |sum|^2 for independent inputs. Over a million elements the squared error
    // concentrates within a few per mille of its mean, so twice the RMS bound is never reached.
    const double omega = std::min(512.0 / (127.0 * 127.0), std::sqrt(512.0) / 127.0);
    if (n > 100) EXPECT_LE(std::sqrt(err / norm), 2 * std::sqrt(omega * (2 + omega))) << n;
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
  const double u = 0x1p-24;
  const double p = size();
  for (Algorithm a :
       {Algorithm::sparse_recursive_doubling, Algorithm::sparse_split, Algorithm::dense}) {
    ErrorFeedback ef(n);
    AllreduceOptions opt;
    opt.algorithm = a;
    std::vector<double> mean(n, 0.0), rounded(n, 0.0);
    std::vector<float> out(n), e_prev(n, 0.0f);
    const int steps = 200;
    for (int t = 0; t < steps; ++t) {
      world().allreduce(x, out, codec, &ef, opt);
      for (std::size_t i = 0; i < n; ++i) {
        mean[i] += out[i];
        // This rank's v = fl(x + e) (top-k's e = v - C(v) is exact) and what it sent, |d| <=
        // |v|: the step's roundings come from these.
        const float v = x[i] + e_prev[i];
        rounded[i] += std::fabs(v) + std::fabs(ef.residual()[i]);
        e_prev[i] = ef.residual()[i];
      }
    }
    std::vector<float> e(ef.residual().begin(), ef.residual().end());
    const auto esum = test::mpi_sum(e);
    std::vector<double> all_rounded(n), abs_x(n), all_abs_x(n);
    for (std::size_t i = 0; i < n; ++i) abs_x[i] = std::fabs(x[i]) + std::fabs(e[i]) / steps;
    MPI_Allreduce(rounded.data(), all_rounded.data(), static_cast<int>(n), MPI_DOUBLE, MPI_SUM,
                  MPI_COMM_WORLD);
    MPI_Allreduce(abs_x.data(), all_abs_x.data(), static_cast<int>(n), MPI_DOUBLE, MPI_SUM,
                  MPI_COMM_WORLD);
    // Per element, the identity holds up to: each step's v = fl(x + e) on every rank (u |v|)
    // and the sum of the P contributions in float (P - 1 roundings of at most u sum |d|), so
    // (P + 1) u sum_r (|v| + |e|) per step, averaged over the T steps; the test's own float sums
    // of x and e ((P - 1) u); and its double mean (T 2^-53 relative, covered by the margin of
    // (P + 1) over P).
    double err = 0, enorm = 0, xnorm = 0, xmax = 0, rnorm = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const double d = mean[i] / steps - sum[i];
      err += d * d;
      enorm += static_cast<double>(esum[i]) * esum[i];
      xnorm += static_cast<double>(x[i]) * x[i];
      const double r = (p + 1) * u * all_rounded[i] / steps + (p - 1) * u * all_abs_x[i];
      rnorm += r * r;
    }
    err = std::sqrt(err);
    xnorm = std::sqrt(xnorm);
    MPI_Allreduce(&xnorm, &xmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    EXPECT_NEAR(err, std::sqrt(enorm) / steps, std::sqrt(rnorm)) << algorithm_name(a);
    // The residuals, each within q' / (1 - q') ||x_r|| (q' = q (1 + u) for the rounding of v),
    // summed in float.
    const double q = std::sqrt(1 - 0.1) * (1 + u);
    // With the identity above, the mean converges to the dense sum like 1/T.
    EXPECT_LE(std::sqrt(enorm), p * q / (1 - q) * xmax * (1 + p * u)) << algorithm_name(a);
  }
}

}  // namespace
}  // namespace gcomp
