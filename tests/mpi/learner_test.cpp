// auto's learning (collectives/planning/learner.hpp) as pure bookkeeping: exploration in rounds, the
// lower quartile of measured runs over predictions, ties to the uncompressed allreduce, and the
// periodic recheck. No MPI: every rank runs the same checks.
#include "learner.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "auto_choice.hpp"
#include "gcomp/error.hpp"

namespace gcomp::detail {
namespace {

constexpr Choice kDense{Algorithm::dense, true};
constexpr Choice kGather{Algorithm::allgather, true};
constexpr Choice kCrs{Algorithm::compressed_reduce_scatter, true};
constexpr Choice kPlain{Algorithm::dense, false};

bool same(Choice a, Choice b) { return a.algorithm == b.algorithm && a.compressed == b.compressed; }

// Runs `calls` choices, each "measured" at truth[choice], and returns what ran.
std::vector<Choice> run(AutoLearner& l, std::uint64_t group, const std::vector<Option>& options,
                        const std::map<int, double>& truth, int calls) {
  std::vector<Choice> ran;
  for (int i = 0; i < calls; ++i) {
    const Choice c = l.choose(group, options);
    ran.push_back(c);
    const int id = static_cast<int>(c.algorithm) * 2 + c.compressed;
    l.record(AutoLearner::key_of(group, c), truth.at(id));
  }
  return ran;
}
int id(Choice c) { return static_cast<int>(c.algorithm) * 2 + c.compressed; }

TEST(Learner, KeysKeepTheirGroupAndStayBelow2To63) {
  const std::uint64_t g = AutoLearner::group_of("qsgd:bits=4,bucket=512", 1000000);
  EXPECT_NE(g, 0u);
  for (Choice c : {kDense, kGather, kCrs, kPlain}) {
    const std::uint64_t k = AutoLearner::key_of(g, c);
    EXPECT_EQ(AutoLearner::group_of_key(k), g);
    EXPECT_LT(k, std::uint64_t{1} << 63);
  }
  // Sizes within a quarter octave share a group; others and other specs do not.
  EXPECT_EQ(AutoLearner::group_of("sign", 1 << 20), AutoLearner::group_of("sign", (1 << 20) + 1000));
  EXPECT_NE(AutoLearner::group_of("sign", 1 << 20), AutoLearner::group_of("sign", 1 << 21));
  EXPECT_NE(AutoLearner::group_of("sign", 1 << 20),
            AutoLearner::group_of("sign", (1 << 20) + (1 << 18)));
  EXPECT_NE(AutoLearner::group_of("sign", 1 << 20), AutoLearner::group_of("fp16", 1 << 20));
}

// Each option within the bounds runs once per round, cheapest prediction first; one predicted
// far slower than twice the best (+ 1 ms) never runs while the measurements agree with the model.
TEST(Learner, ExploresInRoundsThenKeepsTheFastest) {
  AutoLearner l;
  const std::uint64_t g = AutoLearner::group_of("fp16", 4096);
  const std::vector<Option> options = {{kDense, 0.010}, {kGather, 0.008}, {kCrs, 0.050},
                                       {kPlain, 0.012}};
  const std::map<int, double> truth = {
      {id(kDense), 0.010}, {id(kGather), 0.009}, {id(kCrs), 0.001}, {id(kPlain), 0.0085}};
  const auto ran = run(l, g, options, truth, 9);
  const Choice want[] = {kGather, kDense, kPlain, kGather, kDense, kPlain, kGather, kDense, kPlain};
  for (int i = 0; i < 9; ++i) EXPECT_TRUE(same(ran[i], want[i])) << i;
  // Measured: plain 8.5 ms beats the allgather's 9 ms, which the model had put first.
  EXPECT_TRUE(same(l.choose(g, options), kPlain));
  EXPECT_EQ(l.runs(AutoLearner::key_of(g, kCrs)), 0u);
}

TEST(Learner, MeasurementsOutweighPredictions) {
  AutoLearner l;
  const std::uint64_t g = AutoLearner::group_of("topk:ratio=0.01", 65536);
  const std::vector<Option> options = {{kDense, 0.002}, {kGather, 0.001}};
  // The model is wrong about the order: the allgather is three times slower than predicted.
  run(l, g, options, {{id(kDense), 0.0015}, {id(kGather), 0.003}}, 6);
  EXPECT_TRUE(same(l.choose(g, options), kDense));
}

// A model optimistic about its favourite: predicted 10 ms, it measures 45. The uncompressed
// allreduce, predicted 60 ms (more than 2x 10 + 1, and more than the favourite's 45, so its
// prediction alone would never pick it), is tried once the favourite has run kTries times, since
// 60 is within 2x 45 + 1, and wins at its measured 25 ms. The one predicted at 200 ms is still
// never tried.
TEST(Learner, AnOptimisticModelDoesNotKeepTheOthersOut) {
  AutoLearner l;
  const std::uint64_t g = AutoLearner::group_of("powersgd:rank=4", 4216842);
  const std::vector<Option> options = {{kGather, 0.010}, {kPlain, 0.060}, {kCrs, 0.200}};
  const std::map<int, double> truth = {
      {id(kGather), 0.045}, {id(kPlain), 0.025}, {id(kCrs), 0.001}};
  const auto ran = run(l, g, options, truth, 6);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(same(ran[i], kGather)) << i;
  for (int i = 3; i < 6; ++i) EXPECT_TRUE(same(ran[i], kPlain)) << i;
  EXPECT_TRUE(same(l.choose(g, options), kPlain));
  EXPECT_EQ(l.runs(AutoLearner::key_of(g, kCrs)), 0u);
  // A model that was right (the favourite measured as predicted) keeps the 60 ms option out.
  AutoLearner right;
  const auto kept = run(right, g, options, {{id(kGather), 0.010}, {id(kPlain), 0.025}}, 20);
  for (Choice c : kept) EXPECT_TRUE(same(c, kGather));
}

// What auto learns a call cost: the thread's CPU time where waits spin or yield, on host
// tensors, with one library thread (never more than the wall time); the wall time otherwise.
TEST(Learner, ACallCostsItsCpuTimeWhereWaitsKeepTheCore) {
  const double wall = 0.200;
  const double cpu = 0.050;
  EXPECT_EQ(learned_cost(WaitPolicy::spin, 1, false, wall, cpu), cpu);
  EXPECT_EQ(learned_cost(WaitPolicy::yield, 1, false, wall, cpu), cpu);
  EXPECT_EQ(learned_cost(WaitPolicy::sleep, 1, false, wall, cpu), wall);    // a wait uses no CPU
  EXPECT_EQ(learned_cost(WaitPolicy::yield, 2, false, wall, cpu), wall);    // other threads' CPU
  EXPECT_EQ(learned_cost(WaitPolicy::yield, 1, true, wall, cpu), wall);     // the GPU's work
  EXPECT_EQ(learned_cost(WaitPolicy::yield, 1, false, wall, 0.201), wall);  // clock granularity
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(learned_cost(WaitPolicy::yield, 1, false, wall, nan), wall);  // no thread clock
}

// The thread clock counts work, not sleep, and never runs ahead of the wall clock.
TEST(Learner, TheThreadClockCountsWorkNotSleep) {
  using Clock = std::chrono::steady_clock;
  const double c0 = thread_cpu_seconds();
  ASSERT_TRUE(std::isfinite(c0));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_LT(thread_cpu_seconds() - c0, 0.02);  // 100 ms asleep
  const auto w0 = Clock::now();
  const double c1 = thread_cpu_seconds();
  volatile double sink = 0;
  while (thread_cpu_seconds() - c1 < 0.03 && Clock::now() - w0 < std::chrono::seconds(5)) {
    for (int i = 0; i < 10000; ++i) sink = sink + 1e-9 * i;
  }
  const double worked = thread_cpu_seconds() - c1;
  const double waited = std::chrono::duration<double>(Clock::now() - w0).count();
  EXPECT_GE(worked, 0.03);  // it got there, within 5 s
  EXPECT_LE(worked, waited + 1e-3);
}

// The uncompressed allreduce wins a tie: compression must pay.
TEST(Learner, UncompressedWinsTies) {
  AutoLearner l;
  const std::uint64_t g = AutoLearner::group_of("sign", 100000);
  const std::vector<Option> options = {{kGather, 0.004}, {kPlain, 0.005}};
  run(l, g, options, {{id(kGather), 0.004}, {id(kPlain), 0.004}}, 6);
  EXPECT_TRUE(same(l.choose(g, options), kPlain));
}

// The lower quartile, not the fastest run: one lucky run among slow ones does not decide.
TEST(Learner, OneLuckyRunDoesNotDecide) {
  AutoLearner l;
  const std::uint64_t g = AutoLearner::group_of("qsgd", 300000);
  const std::vector<Option> options = {{kGather, 0.001}, {kCrs, 0.001}};
  const std::uint64_t a = AutoLearner::key_of(g, kGather);
  const std::uint64_t b = AutoLearner::key_of(g, kCrs);
  l.record(a, 0.001);  // lucky
  for (int i = 0; i < 7; ++i) l.record(a, 0.005);
  for (int i = 0; i < 8; ++i) l.record(b, 0.003);
  EXPECT_TRUE(same(l.choose(g, options), kCrs));
  // The window keeps the last eight runs: the next one replaces the lucky run...
  l.record(a, 0.001);
  EXPECT_TRUE(same(l.choose(g, options), kCrs));
  // ...and with two fast runs of the last eight (a quartile) the allgather's estimate is 1 ms.
  l.record(a, 0.001);
  EXPECT_TRUE(same(l.choose(g, options), kGather));
}

// Every kRecheck-th run goes to the least-measured other plausible option, so an option measured
// in a slow spell gets another chance and wins once it is faster.
TEST(Learner, RechecksOthersAndRecovers) {
  AutoLearner l;
  const std::uint64_t g = AutoLearner::group_of("fp16", 1 << 20);
  const std::vector<Option> options = {{kGather, 0.001}, {kCrs, 0.0011}, {kPlain, 0.0012}};
  // Exploration in a slow spell for the plain allreduce: 5 ms, the others 1.5 and 2 ms.
  std::map<int, double> truth = {{id(kGather), 0.0015}, {id(kCrs), 0.002}, {id(kPlain), 0.005}};
  auto ran = run(l, g, options, truth, 9);
  ran = run(l, g, options, truth, 2 * AutoLearner::kRecheck);
  int others = 0;
  for (Choice c : ran) others += same(c, kGather) ? 0 : 1;
  EXPECT_EQ(others, 2);  // one recheck in each kRecheck runs
  // The spell ends: the plain allreduce now takes 1 ms and wins after enough rechecks to fill
  // its lower quartile (at most kWindow of its runs, at one per 2 kRecheck runs).
  truth[id(kPlain)] = 0.001;
  ran = run(l, g, options, truth, 2 * AutoLearner::kRecheck * AutoLearner::kWindow);
  EXPECT_TRUE(same(ran.back(), kPlain));
  EXPECT_TRUE(same(l.choose(g, options), kPlain));
}

// A near tie (within 10%) is rechecked every kRecheckClose-th run: an option measured a little
// slower early (as a job's first calls can make it) wins once it is faster, long before the
// kRecheck-th run. An option 20% slower is not rechecked that often.
TEST(Learner, NearTiesAreRecheckedSooner) {
  AutoLearner l;
  const std::uint64_t g = AutoLearner::group_of("topk:ratio=0.01", 1 << 24);
  const std::vector<Option> options = {{kGather, 0.0012}, {kCrs, 0.0010}};
  std::map<int, double> truth = {{id(kGather), 0.00100}, {id(kCrs), 0.00105}};
  run(l, g, options, truth, 6);  // exploration: the allgather measured faster
  EXPECT_TRUE(same(l.choose(g, options), kGather));
  truth[id(kCrs)] = 0.0009;  // past the first calls the other is faster
  const auto ran = run(l, g, options, truth, static_cast<int>(AutoLearner::kRecheckClose));
  EXPECT_TRUE(same(ran.back(), kCrs));
  EXPECT_TRUE(same(l.choose(g, options), kCrs));

  AutoLearner far;
  truth = {{id(kGather), 0.00100}, {id(kCrs), 0.0012}};
  run(far, g, options, truth, 6);
  const auto later = run(far, g, options, truth, static_cast<int>(AutoLearner::kRecheck) - 8);
  for (Choice c : later) EXPECT_TRUE(same(c, kGather));
}

// Over a long job the rechecks thin out: every kRecheck-th run for the first 512 runs of a
// group, every 8 kRecheck-th from 2048 on (near ties likewise, every kRecheckClose-th and every 8
// kRecheckClose-th), and they keep coming.
TEST(Learner, RechecksThinOutInALongJob) {
  EXPECT_EQ(AutoLearner::backoff(0), 1u);
  EXPECT_EQ(AutoLearner::backoff(511), 1u);
  EXPECT_EQ(AutoLearner::backoff(512), 2u);
  EXPECT_EQ(AutoLearner::backoff(1024), 4u);
  EXPECT_EQ(AutoLearner::backoff(2048), 8u);
  EXPECT_EQ(AutoLearner::backoff(std::uint64_t{1} << 40), 8u);
  const std::vector<Option> options = {{kGather, 0.0010}, {kCrs, 0.0011}};
  for (double other : {0.0015, 0.00105}) {  // within 2x; a near tie
    AutoLearner l;
    const std::uint64_t g = AutoLearner::group_of("qsgd", 1 << 22);
    const auto ran = run(l, g, options, {{id(kGather), 0.0010}, {id(kCrs), other}}, 4096);
    const auto others = [&](int from, int to) {
      int k = 0;
      for (int i = from; i < to; ++i) k += same(ran[static_cast<std::size_t>(i)], kGather) ? 0 : 1;
      return k;
    };
    const int every = static_cast<int>(other < 0.0011 ? AutoLearner::kRecheckClose
                                                       : AutoLearner::kRecheck);
    EXPECT_EQ(others(64, 512), (512 - 64) / every) << other;
    EXPECT_EQ(others(2048, 4096), 2048 / (8 * every)) << other;
  }
}

// choose(pending) is choose() after record(pending): a rank's guess before the agreement.
TEST(Learner, PendingCountsAsRecorded) {
  const std::uint64_t g = AutoLearner::group_of("terngrad", 5000);
  const std::vector<Option> options = {{kDense, 0.001}, {kGather, 0.0012}, {kCrs, 0.0013}};
  const std::map<int, double> truth = {{id(kDense), 0.003}, {id(kGather), 0.001}, {id(kCrs), 0.002}};
  AutoLearner a;
  AutoLearner b;
  for (int i = 0; i < 80; ++i) {
    const Choice c = a.choose(g, options);
    const std::uint64_t key = AutoLearner::key_of(g, c);
    const double t = truth.at(id(c));
    const Choice guess = b.choose(g, options, key, t);
    a.record(key, t);
    EXPECT_TRUE(same(guess, a.choose(g, options))) << i;
    b.record(key, t);
  }
}

// Groups learn apart.
TEST(Learner, GroupsAreIndependent) {
  AutoLearner l;
  const std::uint64_t g1 = AutoLearner::group_of("sign", 1000);
  const std::uint64_t g2 = AutoLearner::group_of("sign", 1000000);
  const std::vector<Option> options = {{kGather, 0.001}, {kPlain, 0.002}};
  run(l, g1, options, {{id(kGather), 0.004}, {id(kPlain), 0.001}}, 6);
  EXPECT_TRUE(same(l.choose(g1, options), kPlain));
  EXPECT_TRUE(same(l.choose(g2, options), kGather));  // nothing measured: the model's first
}

// Algorithm numbers beyond today's table (9, 15, the largest a key holds) keep their group and
// their own key: no two (group, algorithm, compressed) share one, and a run recorded under one
// group counts in no other. Packing the choice into 4 bits fails all three.
TEST(Learner, KeysHoldAnyAlgorithmNumber) {
  const std::uint64_t g1 = AutoLearner::group_of("topk:ratio=0.01", 1 << 20);
  const std::uint64_t g2 = AutoLearner::group_of("topk:ratio=0.01", 1 << 22);
  std::set<std::uint64_t> keys;
  for (std::uint64_t g : {g1, g2}) {
    for (int a : {0, 1, 7, 8, 9, 15, 16, AutoLearner::kMaxAlgorithms - 1}) {
      for (bool compressed : {false, true}) {
        const std::uint64_t k = AutoLearner::key_of(g, {static_cast<Algorithm>(a), compressed});
        EXPECT_EQ(AutoLearner::group_of_key(k), g) << a;
        EXPECT_LT(k, std::uint64_t{1} << 63);
        EXPECT_NE(k, 0u);
        EXPECT_TRUE(keys.insert(k).second) << "key of algorithm " << a << " taken";
      }
    }
  }
  EXPECT_THROW(AutoLearner::key_of(g1, {static_cast<Algorithm>(AutoLearner::kMaxAlgorithms), true}),
               Error);
  EXPECT_THROW(AutoLearner::key_of(g1, {static_cast<Algorithm>(-1), true}), Error);

  // A group's runs are its own: 300 runs of algorithm 15 in g1 bring g1 to its thinned-out
  // rechecks, while g2 (nothing recorded) still explores from its first call.
  AutoLearner l;
  const Choice nine{static_cast<Algorithm>(9), true};
  const Choice fifteen{static_cast<Algorithm>(15), true};
  for (int i = 0; i < 300; ++i) l.record(AutoLearner::key_of(g1, fifteen), 0.001);
  EXPECT_EQ(l.runs(AutoLearner::key_of(g1, fifteen)), 300u);
  EXPECT_EQ(l.runs(AutoLearner::key_of(g2, fifteen)), 0u);
  EXPECT_EQ(l.runs(AutoLearner::key_of(g1, nine)), 0u);
  const std::vector<Option> options = {{nine, 0.001}, {fifteen, 0.002}};
  EXPECT_TRUE(same(l.choose(g2, options), nine));  // g2: the model's first, unmeasured
}

// The uncompressed allreduce comes last among auto's options; with as many options as the table
// allows it is the ninth, and it must still be weighed (a learner keeping 8 dropped it).
TEST(Learner, TheLastOptionIsNeverDropped) {
  static_assert(AutoLearner::kMaxOptions >= 9);
  AutoLearner l;
  const std::uint64_t g = AutoLearner::group_of("fp16", 1 << 16);
  std::vector<Option> options;
  std::map<int, double> truth;
  for (int a = 1; a <= 8; ++a) {
    const Choice c{static_cast<Algorithm>(a), true};
    options.push_back({c, 0.010});
    truth[id(c)] = 0.010;
  }
  options.push_back({kPlain, 0.009});
  truth[id(kPlain)] = 0.004;
  ASSERT_EQ(options.size(), 9u);
  const auto ran = run(l, g, options, truth, 40);
  EXPECT_TRUE(same(ran[0], kPlain));  // the cheapest prediction is explored first
  EXPECT_TRUE(same(l.choose(g, options), kPlain));  // and, measured fastest, kept

  // More options than the table can produce are a bug in the caller: an error, not a drop.
  options.resize(AutoLearner::kMaxOptions + 1, Option{kGather, 0.02});
  EXPECT_THROW(l.choose(g, options), Error);
}

}  // namespace
}  // namespace gcomp::detail
