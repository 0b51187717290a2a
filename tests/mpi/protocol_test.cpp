// The call protocol: ranks that disagree, or one whose own step fails, make every rank throw
// (never hang: the watchdog in mpi_main.cpp and CTest's timeout would fail the run), and the
// communicator works again afterwards. Also buckets, stats and the C API.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "agreement.hpp"
#include "feedback_slot.hpp"
#include "gcomp/cost_model.hpp"
#include "gcomp/gcomp_mpi.h"
#include "mpi_util.hpp"

namespace gcomp {
namespace {

using test::rank;
using test::size;
using test::status_of;
using test::world;

// Runs f on this rank and returns the status it threw (ok when it did not).
struct Case {
  const char* spec;
  Algorithm algorithm;
};

void still_works() {
  const Codec codec("topk:ratio=0.1");
  const auto x = test::integers(1000, 99);
  std::vector<float> out(x.size());
  AllreduceOptions applied;
  applied.allow_uncompressed = false;
  // Named: on ranks of several hosts auto may run two_level, which compresses each host's sum.
  applied.algorithm = Algorithm::sparse_allgather;
  world().allreduce(x, out, codec, nullptr, applied);
  EXPECT_EQ(out, test::mpi_sum(test::contribution(codec, x, 0)));
}

TEST(Mismatch, AnotherSpecOnOneRank) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks";
  const Codec codec(rank() == 1 ? "topk:ratio=0.2" : "topk:ratio=0.1");
  const auto x = test::input(1000, 1);
  std::vector<float> out(x.size());
  std::string msg;
  EXPECT_EQ(status_of([&] { world().allreduce(x, out, codec); }, &msg), Status::mismatch);
  EXPECT_NE(msg.find("disagree"), std::string::npos) << msg;
  still_works();
}

TEST(Mismatch, AnotherCountOnOneRank) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks";
  const Codec codec("qsgd");
  const auto x = test::input(rank() == size() - 1 ? 999 : 1000, 2);
  std::vector<float> out(x.size());
  EXPECT_EQ(status_of([&] { world().allreduce(x, out, codec); }), Status::mismatch);
  still_works();
}

TEST(Mismatch, AnotherAlgorithmOnOneRank) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks";
  const Codec codec("topk:ratio=0.1");
  const auto x = test::input(1000, 3);
  std::vector<float> out(x.size());
  AllreduceOptions opt;
  opt.algorithm = rank() == 0 ? Algorithm::sparse_split : Algorithm::sparse_recursive_doubling;
  EXPECT_EQ(status_of([&] { world().allreduce(x, out, codec, nullptr, opt); }), Status::mismatch);
  still_works();
}

TEST(Mismatch, NanOnOneRankFailsEveryRank) {
  for (const char* spec : {"none", "qsgd", "topk:ratio=0.01", "threshold:tau=1"}) {
    const Codec codec(spec);
    auto x = test::input(5000, 4);
    if (rank() == size() - 1) x[1234] = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> out(x.size());
    ErrorFeedback ef(x.size());
    const auto before = std::vector<float>(ef.residual().begin(), ef.residual().end());
    std::string msg;
    const Status s = status_of([&] { world().allreduce(x, out, codec, &ef); }, &msg);
    if (rank() == size() - 1) {
      EXPECT_EQ(s, Status::nonfinite) << spec;
      EXPECT_NE(msg.find("1234"), std::string::npos) << msg;
    } else {
      EXPECT_EQ(s, Status::mismatch) << spec;
      EXPECT_NE(msg.find("rank " + std::to_string(size() - 1)), std::string::npos) << msg;
    }
    // Nobody's residual moved.
    EXPECT_EQ(std::vector<float>(ef.residual().begin(), ef.residual().end()), before);
  }
  still_works();
}

// The seed is part of what must agree: random-k's ranks would otherwise select different
// supports (their sum no longer k-sparse) without a word.
TEST(Mismatch, AnotherSeedOnOneRank) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks";
  for (const char* spec : {"randomk:ratio=0.1", "qsgd", "none"}) {
    const Codec codec(spec);
    const auto x = test::input(1000, 8);
    std::vector<float> out(x.size());
    AllreduceOptions opt;
    opt.seed = rank() == 1 ? 8 : 7;
    std::string msg;
    EXPECT_EQ(status_of([&] { world().allreduce(x, out, codec, nullptr, opt); }, &msg),
              Status::mismatch)
        << spec;
    EXPECT_NE(msg.find("seed=" + std::to_string(opt.seed)), std::string::npos) << msg;
  }
  still_works();
}

// What the caller's buffers hold after a failure found before the exchange (here NaN on one
// rank): out as it was and the residual as it was, out of place and in place, on every rank
// and for every kind of codec.
TEST(Failure, BuffersAreUntouchedWhenTheCallFailsBeforeTheExchange) {
  for (const char* spec : {"none", "fp16", "qsgd", "topk:ratio=0.01"}) {
    for (bool with_ef : {false, true}) {
      const Codec codec(spec);
      auto x = test::input(3000, 9);
      if (rank() == size() - 1) x[77] = std::numeric_limits<float>::quiet_NaN();
      ErrorFeedback ef(x.size());
      if (with_ef) {  // a residual that is not zero, from one good call
        const auto good = test::input(3000, 10);
        std::vector<float> scratch(good.size());
        AllreduceOptions applied;
        applied.allow_uncompressed = false;
        world().allreduce(good, scratch, codec, &ef, applied);
      }
      const std::vector<float> residual(ef.residual().begin(), ef.residual().end());
      const std::vector<float> sentinel(x.size(), 7.0f);
      std::vector<float> out = sentinel;
      EXPECT_NE(status_of([&] { world().allreduce(x, out, codec, with_ef ? &ef : nullptr); }),
                Status::ok);
      EXPECT_TRUE(test::all_ranks(out == sentinel)) << spec << " out of place";
      std::vector<float> io = x;
      EXPECT_NE(status_of([&] { world().allreduce(io, codec, with_ef ? &ef : nullptr); }),
                Status::ok);
      EXPECT_TRUE(test::all_ranks(std::memcmp(io.data(), x.data(), 4 * x.size()) == 0))
          << spec << " in place";
      EXPECT_TRUE(test::all_ranks(std::vector<float>(ef.residual().begin(), ef.residual().end()) ==
                                  residual))
          << spec;
    }
  }
  still_works();
}

// Finite inputs whose sum overflows float32: one behaviour for every algorithm, Error(nonfinite)
// on every rank, with the residual not committed.
TEST(Failure, ASumThatOverflowsFailsEveryAlgorithmAlike) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks to overflow";
  const Case cases[] = {{"none", Algorithm::dense},
                        {"none", Algorithm::allgather},
                        {"none", Algorithm::compressed_reduce_scatter},
                        {"topk:ratio=0.5", Algorithm::dense},
                        {"topk:ratio=0.5", Algorithm::sparse_allgather},
                        {"topk:ratio=0.5", Algorithm::sparse_recursive_doubling},
                        {"topk:ratio=0.5", Algorithm::sparse_split},
                        {"none", Algorithm::two_level},
                        {"topk:ratio=0.5", Algorithm::two_level},
                        {"qsgd:bits=4", Algorithm::two_level}};
  for (const Case& c : cases) {
    for (bool average : {false, true}) {
      const Codec codec(c.spec);
      std::vector<float> x(4001, 2e38f);
      x[5] = 1.0f;  // not every element overflows
      ErrorFeedback ef(x.size());
      std::vector<float> out(x.size());
      AllreduceOptions opt;
      opt.algorithm = c.algorithm;
      opt.average = average;
      std::string msg;
      EXPECT_EQ(status_of([&] { world().allreduce(x, out, codec, &ef, opt); }, &msg),
                Status::nonfinite)
          << c.spec << " " << algorithm_name(c.algorithm);
      for (float e : ef.residual()) ASSERT_EQ(e, 0.0f) << c.spec << ": residual committed";
    }
  }
  still_works();
}

// The bound that lets an uncompressed call skip the check of its sum: P * M <= FLT_MAX / 2, and
// nothing from a rank that did not measure.
TEST(Agreement, TheMagnitudeBoundsTheSum) {
  using detail::sum_cannot_overflow;
  const auto bits = [](float f) { return std::uint64_t{std::bit_cast<std::uint32_t>(f)}; };
  const float inf = std::numeric_limits<float>::infinity();
  const float max = std::numeric_limits<float>::max();
  EXPECT_TRUE(sum_cannot_overflow(1, bits(max / 2)));
  EXPECT_FALSE(sum_cannot_overflow(1, bits(std::nextafter(max / 2, inf))));
  EXPECT_TRUE(sum_cannot_overflow(4, bits(max / 8)));
  EXPECT_FALSE(sum_cannot_overflow(4, bits(std::nextafter(max / 8, inf))));
  EXPECT_FALSE(sum_cannot_overflow(3, bits(max / 4)));
  EXPECT_TRUE(sum_cannot_overflow(1 << 20, bits(1e30f)));
  EXPECT_TRUE(sum_cannot_overflow(2, 0));
  EXPECT_FALSE(sum_cannot_overflow(2, detail::kNotMeasured));
  EXPECT_FALSE(sum_cannot_overflow(0, 0));
}

// Inputs at the bound (every rank FLT_MAX / (2P), the check after the collective skipped): the
// sum is finite and right, for every uncompressed path, summed or averaged.
TEST(Failure, ASumAtTheBoundIsFinite) {
  const int p = size();
  const float m = std::numeric_limits<float>::max() / 2 / static_cast<float>(p);
  const Case cases[] = {
      {"none", Algorithm::dense}, {"none", Algorithm::allgather}, {"none", Algorithm::automatic}};
  for (const Case& c : cases) {
    for (bool average : {false, true}) {
      const Codec codec(c.spec);
      std::vector<float> x(4001, m);
      x[7] = -m;
      ErrorFeedback ef(x.size());
      std::vector<float> out(x.size());
      AllreduceOptions opt;
      opt.algorithm = c.algorithm;
      opt.average = average;
      ASSERT_EQ(status_of([&] { world().allreduce(x, out, codec, &ef, opt); }), Status::ok)
          << c.spec << " " << algorithm_name(c.algorithm);
      const double want = static_cast<double>(m) * (average ? 1 : p);
      for (std::size_t i = 0; i < x.size(); ++i) {
        ASSERT_NEAR(out[i], i == 7 ? -want : want, want * 1e-6) << algorithm_name(c.algorithm);
      }
    }
  }
  still_works();
}

TEST(Mismatch, AlgorithmThatDoesNotSuitTheCodec) {
  const Codec codec("qsgd");
  const auto x = test::input(100, 5);
  std::vector<float> out(x.size());
  AllreduceOptions opt;
  opt.algorithm = Algorithm::sparse_split;
  EXPECT_EQ(status_of([&] { world().allreduce(x, out, codec, nullptr, opt); }),
            Status::invalid_argument);
  still_works();
}

TEST(Mismatch, AbandonUnblocksTheOthers) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks";
  const Codec codec("sign");
  const auto x = test::input(100, 6);
  std::vector<float> out(x.size());
  if (rank() == 0) {
    world().abandon(Status::internal, "this rank's gradient step failed");
  } else {
    std::string msg;
    EXPECT_EQ(status_of([&] { world().allreduce(x, out, codec); }, &msg), Status::mismatch);
    EXPECT_NE(msg.find("rank 0"), std::string::npos) << msg;
  }
  still_works();
}

TEST(Mismatch, BadEnvironmentAlgorithm) {
  setenv("GCOMP_ALGORITHM", rank() == 0 ? "warp_drive" : "dense", 1);
  const Codec codec("none");
  const auto x = test::input(100, 7);
  std::vector<float> out(x.size());
  const Status s = status_of([&] { world().allreduce(x, out, codec); });
  unsetenv("GCOMP_ALGORITHM");
  EXPECT_EQ(s, rank() == 0 ? Status::invalid_argument : Status::mismatch);
  still_works();
}

TEST(Environment, AlgorithmOverridesAuto) {
  setenv("GCOMP_ALGORITHM", "sparse_split", 1);
  const Codec codec("topk:ratio=0.01");
  const auto x = test::input(10000, 8);
  std::vector<float> out(x.size());
  world().allreduce(x, out, codec);
  EXPECT_EQ(world().last_stats().algorithm, Algorithm::sparse_split);
  // An explicit option wins over the environment.
  AllreduceOptions opt;
  opt.algorithm = Algorithm::sparse_allgather;
  world().allreduce(x, out, codec, nullptr, opt);
  EXPECT_EQ(world().last_stats().algorithm, Algorithm::sparse_allgather);
  unsetenv("GCOMP_ALGORITHM");
}

// fewest_bytes, asked for or from GCOMP_ALGORITHM, runs what the byte model's rule says for the
// call (fewest_bytes_algorithm), the codec applied, the same on every rank.
TEST(Environment, FewestBytesRunsTheRulesAlgorithm) {
  const auto x = test::input(366432, 10);
  std::vector<float> out(x.size());
  for (const char* spec : {"none", "fp16", "topk:ratio=0.01,chunk=4096,bits=2", "qsgd:bits=4"}) {
    const Codec codec(spec);
    AllreduceOptions opt;
    opt.algorithm = Algorithm::fewest_bytes;
    world().allreduce(x, out, codec, nullptr, opt);
    const Algorithm ran = world().last_stats().algorithm;
    EXPECT_TRUE(world().last_stats().compressed) << spec;
    EXPECT_EQ(ran == Algorithm::dense, codec.kind() == CodecKind::none) << spec;
    ModelInput in;
    in.n = static_cast<double>(x.size());
    in.ranks = size();
    in.codec = &codec;
    in.codec_none = codec.kind() == CodecKind::none;
    in.sparse = codec.properties().sparse;
    in.sent = static_cast<double>(in.sparse ? codec.selected(x.size()) : 0);
    in.payload_bytes = static_cast<double>(
        codec.expected_bytes(x.size(), static_cast<std::size_t>(in.sent)));
    if (size() > 1) EXPECT_EQ(ran, fewest_bytes_algorithm(in)) << spec;
    int mine = static_cast<int>(ran), least = 0, most = 0;
    MPI_Allreduce(&mine, &least, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&mine, &most, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    EXPECT_EQ(least, most) << spec;
    setenv("GCOMP_ALGORITHM", "fewest_bytes", 1);
    world().allreduce(x, out, codec);
    unsetenv("GCOMP_ALGORITHM");
    EXPECT_EQ(world().last_stats().algorithm, ran) << spec;
  }
}

TEST(Stats, BytesAreWhatMpiWasHanded) {
  const Codec codec("topk:ratio=0.01");
  const std::size_t n = 100000;
  const auto x = test::input(n, 9);
  AllreduceOptions opt;
  opt.algorithm = Algorithm::sparse_allgather;
  std::vector<float> out(n);
  world().allreduce(x, out, codec, nullptr, opt);
  const CallStats& s = world().last_stats();
  // Each rank's payload (its packed indices' size depends on its selection), as the codec makes it.
  const std::uint64_t mine = codec.encode(x, test::rank_seed(codec, 0)).size();
  std::uint64_t all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  const std::uint64_t p = static_cast<std::uint64_t>(size());
  // The agreement (eleven int64 each way), the sizes (8 bytes to each peer), the payload to each.
  EXPECT_EQ(s.bytes_sent, 2 * 96 + (p - 1) * (8 + mine));
  EXPECT_EQ(s.bytes_received, 2 * 96 + (p - 1) * 8 + (all - mine));
  EXPECT_GE(s.comm_seconds, 0.0);
  EXPECT_GT(s.encode_seconds, 0.0);
  EXPECT_EQ(s.calls, 1u);
  EXPECT_TRUE(s.compressed);
  const TotalStats before = world().total_stats();
  world().allreduce(x, out, codec, nullptr, opt);
  EXPECT_EQ(world().total_stats().calls, before.calls + 1);
  EXPECT_EQ(world().total_stats().compressed, before.compressed + 1);
}

// The other tests' communicator is given its numbers (test::world()); this one measures them, as
// users' do: the network and speeds come out finite and non-negative, and auto, whatever it
// chooses from them, sums the contributions.
TEST(Measured, ACommunicatorThatMeasuresWorks) {
  const auto made = test::make_communicator();
  Communicator& comm = *made;
  const NetworkModel& m = comm.network();
  for (double v :
       {m.alpha, m.beta, m.beta_all, m.beta_one, m.beta_allreduce, m.beta_allreduce_large}) {
    EXPECT_TRUE(std::isfinite(v) && v >= 0) << v;
  }
  const Codec codec("topk:ratio=0.05");
  const auto x = test::input(30000, 12);
  const auto mine = test::contribution(codec, x, 4);
  const auto ref = test::mpi_sum(mine);
  const auto tol = test::order_tolerance(mine);
  AllreduceOptions opt;
  opt.allow_uncompressed = false;
  opt.seed = 4;
  std::vector<float> out(x.size());
  for (int call = 0; call < 3; ++call) {
    comm.allreduce(x, out, codec, nullptr, opt);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < x.size(); ++i) bad += !(std::fabs(out[i] - ref[i]) <= tol[i]);
    EXPECT_EQ(bad, 0u) << "call " << call << ", " << algorithm_name(comm.last_stats().algorithm);
    EXPECT_TRUE(test::same_on_all_ranks(out));
  }
  for (double t : comm.predict(codec, x.size())) EXPECT_TRUE(t >= 0) << t;
}

TEST(Buckets, FusedTensorsWithPerTensorErrorFeedback) {
  const std::vector<std::size_t> sizes = {3, 5000, 100000, 7, 200000, 20000};
  std::vector<std::vector<float>> data, original;
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    data.push_back(test::input(sizes[t], 20 + static_cast<std::uint32_t>(t)));
  }
  original = data;
  std::vector<std::span<float>> spans(data.begin(), data.end());
  std::vector<ErrorFeedback> mem;
  for (std::size_t n : sizes) mem.emplace_back(n);
  std::vector<ErrorFeedback*> efs;
  for (auto& m : mem) efs.push_back(&m);
  BucketOptions opt;
  opt.bucket_bytes = 4 * 150000;  // several buckets
  const Codec codec("topk:ratio=0.01");
  world().allreduce_buckets(spans, codec, efs, opt);
  // Buckets {5000, 100000}, {200000}, {20000} and the dense one of {3, 7}.
  EXPECT_EQ(world().last_stats().calls, 4u);
  // What each rank sent for tensor t is v - e_after = x + e_before - e_after (e_before = 0);
  // small tensors go dense, uncompressed (their residual stays zero). For top-k, e_after is v or
  // 0, so the test's fl(fl(x + e_before) - e_after) is exactly what was sent, and only the order
  // of the sum differs.
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    std::vector<float> sent(sizes[t]);
    for (std::size_t i = 0; i < sizes[t]; ++i) sent[i] = original[t][i] - mem[t].residual()[i];
    const auto ref = test::mpi_sum(sent);
    const auto tol = test::order_tolerance(sent);
    for (std::size_t i = 0; i < sizes[t]; ++i) {
      ASSERT_LE(std::fabs(data[t][i] - ref[i]), tol[i]) << "tensor " << t << " i " << i;
    }
    if (sizes[t] < opt.dense_below) {
      for (float e : mem[t].residual()) ASSERT_EQ(e, 0.0f);
    }
  }
  // A second step carries the residuals.
  std::vector<std::vector<float>> before;
  for (auto& m : mem) before.emplace_back(m.residual().begin(), m.residual().end());
  data = original;
  world().allreduce_buckets(spans, codec, efs, opt);
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    std::vector<float> sent(sizes[t]);
    for (std::size_t i = 0; i < sizes[t]; ++i) {
      sent[i] = original[t][i] + before[t][i] - mem[t].residual()[i];
    }
    const auto ref = test::mpi_sum(sent);
    const auto tol = test::order_tolerance(sent);
    for (std::size_t i = 0; i < sizes[t]; ++i) {
      ASSERT_LE(std::fabs(data[t][i] - ref[i]), tol[i]) << "tensor " << t;
    }
  }
}

// Tensors that are views of one buffer, in order (DDP's bucket), are reduced where they lie; the
// results and residuals are those of the same tensors in buffers of their own, bit for bit, over
// two steps, for a sparse codec with error feedback, a dense one, and powersgd with its state;
// and also where the views come in another order than the buffer's (which copies them together).
TEST(Buckets, ViewsOfOneBufferGiveTheBitsOfSeparateTensors) {
  const std::vector<MatrixShape> shapes = {{3, 1}, {80, 60}, {5000, 1}, {7, 1}, {120, 90}};
  struct Case {
    const char* spec;
    Algorithm algorithm;
    bool ef;
  };
  const Case cases[] = {{"topk:ratio=0.01", Algorithm::sparse_allgather, true},
                        {"qsgd:bits=4", Algorithm::allgather, false},
                        {"powersgd:rank=2", Algorithm::low_rank, true}};
  for (const Case& c : cases) {
    for (bool reversed : {false, true}) {
      SCOPED_TRACE(std::string(c.spec) + (reversed ? ", views out of order" : ""));
      std::size_t total = 0;
      for (const MatrixShape& m : shapes) total += m.rows * m.cols;
      std::vector<float> buffer(total);
      std::vector<std::vector<float>> own;
      std::vector<std::span<float>> views, apart;
      std::vector<MatrixShape> order;
      std::size_t at = 0;
      for (std::size_t t = 0; t < shapes.size(); ++t) {
        const std::size_t n = shapes[t].rows * shapes[t].cols;
        views.emplace_back(buffer.data() + at, n);
        own.emplace_back(n);
        at += n;
      }
      for (std::size_t t = 0; t < shapes.size(); ++t) apart.emplace_back(own[t]);
      order = shapes;
      if (reversed) {
        std::reverse(views.begin(), views.end());
        std::reverse(apart.begin(), apart.end());
        std::reverse(order.begin(), order.end());
      }
      std::vector<ErrorFeedback> mem_views, mem_apart;
      for (const auto& v : views) {
        mem_views.emplace_back(v.size());
        mem_apart.emplace_back(v.size());
      }
      std::vector<ErrorFeedback*> efs_views, efs_apart;
      for (std::size_t t = 0; t < views.size(); ++t) {
        efs_views.push_back(&mem_views[t]);
        efs_apart.push_back(&mem_apart[t]);
      }
      BucketOptions opt;
      opt.bucket_bytes = 4 * 20000;  // the large tensors in two buckets, the small ones apart
      // Pinned, and never uncompressed: the two calls must take the same path (auto, learning
      // between them, may not).
      opt.allreduce.algorithm = c.algorithm;
      opt.allreduce.allow_uncompressed = false;
      const Codec codec(c.spec);
      for (int step = 0; step < 2; ++step) {
        for (std::size_t t = 0; t < views.size(); ++t) {
          const auto x = test::input(views[t].size(), 40 + static_cast<std::uint32_t>(t + step));
          std::copy(x.begin(), x.end(), views[t].begin());
          std::copy(x.begin(), x.end(), apart[t].begin());
        }
        opt.allreduce.seed = static_cast<std::uint64_t>(step);
        const auto efs_of = [&](std::vector<ErrorFeedback*>& e) {
          return c.ef ? std::span<ErrorFeedback* const>(e) : std::span<ErrorFeedback* const>();
        };
        world().allreduce_buckets(views, order, codec, efs_of(efs_views), opt);
        world().allreduce_buckets(apart, order, codec, efs_of(efs_apart), opt);
        for (std::size_t t = 0; t < views.size(); ++t) {
          ASSERT_EQ(std::memcmp(views[t].data(), apart[t].data(), 4 * views[t].size()), 0)
              << "step " << step << ", tensor " << t;
          const auto ra = mem_views[t].residual(), rb = mem_apart[t].residual();
          ASSERT_EQ(std::memcmp(ra.data(), rb.data(), 4 * ra.size()), 0)
              << "step " << step << ", residual " << t;
        }
      }
      if (c.ef) {
        float moved = 0;  // the residuals are not all zero: error feedback took part
        for (const auto& m : mem_views) {
          for (float e : m.residual()) moved = std::max(moved, std::fabs(e));
        }
        EXPECT_GT(moved, 0.0f);
      }
    }
  }
}

// A bucketed call's statistics count each of its collectives: per algorithm, and those that
// applied the codec (not the dense bucket of the small tensors).
TEST(Buckets, StatisticsCountEveryCollective) {
  std::vector<std::vector<float>> data = {test::input(5000, 1), test::input(7, 2),
                                          test::input(20000, 3)};
  std::vector<std::span<float>> spans(data.begin(), data.end());
  BucketOptions opt;
  opt.bucket_bytes = 1;  // each large tensor a bucket of its own
  opt.allreduce.algorithm = Algorithm::sparse_allgather;
  world().allreduce_buckets(spans, Codec("topk:ratio=0.01"), {}, opt);
  const CallStats& s = world().last_stats();
  EXPECT_EQ(s.calls, 3u);
  EXPECT_EQ(s.by_algorithm[static_cast<int>(Algorithm::sparse_allgather)], 2u);
  EXPECT_EQ(s.by_algorithm[static_cast<int>(Algorithm::dense)], 1u);
  EXPECT_EQ(s.compressed_calls, 2u);
  EXPECT_EQ(s.algorithm, Algorithm::dense);  // the last collective: the small tensors
  // A single allreduce: one call, of its algorithm.
  world().allreduce(std::span<float>(data[0]), Codec("topk:ratio=0.01"), nullptr, opt.allreduce);
  const CallStats& one = world().last_stats();
  EXPECT_EQ(one.calls, 1u);
  EXPECT_EQ(one.by_algorithm[static_cast<int>(Algorithm::sparse_allgather)], 1u);
  EXPECT_EQ(one.by_algorithm[static_cast<int>(Algorithm::dense)], 0u);
  EXPECT_EQ(one.compressed_calls, 1u);
}

// compressed_reduce_scatter compresses twice; in buckets, the owner side's residual lives in the
// tensors' ErrorFeedback objects (each keeps its share of this rank's chunk), not in the
// communicator: fresh objects start from zero, and the memory is what makes the second step.
TEST(Buckets, OwnerMemoryLivesInTheTensorsFeedback) {
  const std::vector<std::size_t> sizes = {30000, 2000, 50000, 7};
  BucketOptions opt;
  opt.bucket_bytes = 4 * 40000;  // buckets {30000, 2000} and {50000}; 7 goes dense
  opt.allreduce.algorithm = Algorithm::compressed_reduce_scatter;
  const Codec codec("sign");
  struct Run {
    std::vector<ErrorFeedback> mem;
    std::vector<ErrorFeedback*> efs;
    std::vector<std::vector<float>> step(const std::vector<std::size_t>& sizes, const Codec& codec,
                                         const BucketOptions& opt) {
      std::vector<std::vector<float>> data;
      for (std::size_t t = 0; t < sizes.size(); ++t) {
        data.push_back(test::input(sizes[t], 40 + static_cast<std::uint32_t>(t)));
      }
      std::vector<std::span<float>> spans(data.begin(), data.end());
      world().allreduce_buckets(spans, codec, efs, opt);
      return data;
    }
  };
  const auto make = [&] {
    Run r;
    for (std::size_t n : sizes) r.mem.emplace_back(n);
    for (auto& m : r.mem) r.efs.push_back(&m);
    return r;
  };
  Run a = make();
  const auto a1 = a.step(sizes, codec, opt);
  const auto a2 = a.step(sizes, codec, opt);
  // Each tensor holds its share of this rank's chunk [len r / P, len (r+1) / P) of its bucket.
  const auto p = static_cast<std::size_t>(size()), r = static_cast<std::size_t>(rank());
  const auto share = [&](std::size_t len, std::size_t begin, std::size_t n) {
    const std::size_t lo = len * r / p, hi = len * (r + 1) / p;
    const std::size_t x = std::max(begin, lo), z = std::min(begin + n, hi);
    return z > x ? z - x : std::size_t{0};
  };
  EXPECT_EQ(gcomp::detail::FeedbackSlot::of(a.mem[0]).size(), share(32000, 0, 30000));
  EXPECT_EQ(gcomp::detail::FeedbackSlot::of(a.mem[1]).size(), share(32000, 30000, 2000));
  EXPECT_EQ(gcomp::detail::FeedbackSlot::of(a.mem[2]).size(), share(50000, 0, 50000));
  EXPECT_TRUE(gcomp::detail::FeedbackSlot::of(a.mem[3]).empty());
  // A new run through the same communicator: the same two steps.
  Run b = make();
  EXPECT_EQ(b.step(sizes, codec, opt), a1);
  const auto b2 = b.step(sizes, codec, opt);
  EXPECT_EQ(b2, a2);
  // Forgetting only the owner side changes the second step (not on one rank: there the owner
  // re-encodes its own scaled signs, exactly, and its residual stays zero).
  if (size() == 1) return;
  Run c = make();
  c.step(sizes, codec, opt);
  for (auto& m : c.mem) gcomp::detail::FeedbackSlot::of(m).clear();
  EXPECT_NE(c.step(sizes, codec, opt), a2);
}

// The bucket of small tensors is summed uncompressed: neither the call's statistics nor the
// running totals count it as compressed.
TEST(Buckets, TotalsCountTheSmallTensorsUncompressed) {
  std::vector<float> big = test::input(20000, 3), small = test::input(100, 4);
  std::vector<std::span<float>> spans = {big, small};
  BucketOptions opt;
  opt.dense_below = 1000;
  opt.allreduce.algorithm = Algorithm::sparse_allgather;  // compressed, whatever auto would say
  const Codec codec("topk:ratio=0.01");
  const TotalStats before = world().total_stats();
  world().allreduce_buckets(spans, codec, {}, opt);
  EXPECT_EQ(world().last_stats().calls, 2u);
  EXPECT_EQ(world().last_stats().compressed_calls, 1u);
  EXPECT_EQ(world().total_stats().calls, before.calls + 2);
  EXPECT_EQ(world().total_stats().compressed, before.compressed + 1);
}

TEST(Buckets, MismatchedLayoutsFailEveryRank) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks";
  std::vector<std::vector<float>> data = {test::input(5000, 1),
                                          test::input(rank() == 1 ? 6000 : 5000, 2)};
  std::vector<std::span<float>> spans(data.begin(), data.end());
  EXPECT_EQ(status_of([&] { world().allreduce_buckets(spans, Codec("sign")); }), Status::mismatch);
  // An empty list on one rank only.
  std::vector<std::span<float>> none;
  EXPECT_EQ(status_of([&] {
              world().allreduce_buckets(rank() == 0 ? std::span<const std::span<float>>(none)
                                                    : std::span<const std::span<float>>(spans),
                                        Codec("sign"));
            }),
            Status::mismatch);
  still_works();
}

// The C API takes top-k per chunk as any spec, and GCOMP_ALGORITHM=fewest_bytes as any
// algorithm: it runs the rule's algorithm (never dense for a codec that compresses) and sends
// the codec's bytes.
TEST(CApi, ChunkedTopkOnTheFewestBytes) {
  gcomp_codec codec = nullptr;
  ASSERT_EQ(gcomp_codec_create("topk:ratio=0.01,chunk=4096,bits=2", &codec), GCOMP_OK)
      << gcomp_last_error();
  const auto x = test::input(100000, 31);
  std::vector<float> out(x.size());
  setenv("GCOMP_ALGORITHM", "fewest_bytes", 1);
  const gcomp_status s =
      gcomp_allreduce(x.data(), out.data(), x.size(), codec, nullptr, 5, MPI_COMM_WORLD);
  unsetenv("GCOMP_ALGORITHM");
  ASSERT_EQ(s, GCOMP_OK) << gcomp_last_error();
  gcomp_stats st;
  ASSERT_EQ(gcomp_last_stats(&st), GCOMP_OK);
  EXPECT_STRNE(st.algorithm, "dense");
  if (size() > 1) {
    // 1% of the elements at under 15 bits an entry: under 2.4 kB a payload; at most P - 1 of
    // them (an allgather's) and the agreement and sizes besides.
    EXPECT_LT(st.bytes_sent, static_cast<std::uint64_t>(size() - 1) * 2400 + 1024) << st.algorithm;
  }
  EXPECT_TRUE(test::same_on_all_ranks(out));
  gcomp_codec_destroy(codec);
}

TEST(CApi, AllreduceAndStats) {
  gcomp_codec codec = nullptr;
  ASSERT_EQ(gcomp_codec_create("topk:ratio=0.1", &codec), GCOMP_OK);
  const auto x = test::integers(1000, 30);
  std::vector<float> out(x.size());
  ASSERT_EQ(gcomp_allreduce(x.data(), out.data(), x.size(), codec, nullptr, 5, MPI_COMM_WORLD),
            GCOMP_OK)
      << gcomp_last_error();
  EXPECT_EQ(out, test::mpi_sum(test::contribution(Codec("topk:ratio=0.1"), x, 5)));
  gcomp_stats st;
  ASSERT_EQ(gcomp_last_stats(&st), GCOMP_OK);
  EXPECT_GT(st.bytes_sent, 0u);
  EXPECT_STRNE(st.algorithm, "");
  // In place, with error feedback.
  gcomp_ef ef = nullptr;
  ASSERT_EQ(gcomp_ef_create(x.size(), &ef), GCOMP_OK);
  std::vector<float> io = x;
  ASSERT_EQ(gcomp_allreduce(io.data(), io.data(), io.size(), codec, ef, 5, MPI_COMM_WORLD),
            GCOMP_OK);
  // A NULL codec on one rank: that rank gets INVALID_ARGUMENT, the others MISMATCH.
  const gcomp_status s = gcomp_allreduce(x.data(), out.data(), x.size(),
                                         rank() == 0 ? nullptr : codec, nullptr, 5, MPI_COMM_WORLD);
  if (rank() == 0) {
    EXPECT_EQ(s, GCOMP_ERR_INVALID_ARGUMENT);
  } else {
    EXPECT_EQ(s, GCOMP_ERR_MISMATCH);
  }
  EXPECT_NE(std::string(gcomp_last_error()), "");
  // A duplicated communicator gets its own gcomp state, freed with it.
  MPI_Comm dup;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  EXPECT_EQ(gcomp_allreduce(x.data(), out.data(), x.size(), codec, nullptr, 5, dup), GCOMP_OK);
  MPI_Comm_free(&dup);
  EXPECT_EQ(gcomp_allreduce(x.data(), out.data(), x.size(), codec, nullptr, 5, MPI_COMM_NULL),
            GCOMP_ERR_INVALID_ARGUMENT);
  gcomp_ef_destroy(ef);
  gcomp_codec_destroy(codec);
}

}  // namespace
}  // namespace gcomp

namespace gcomp {
namespace {

// Every wait policy gives the same sums (the waits only change how the CPU spends the wait),
// the names parse and print, automatic follows GCOMP_WAIT, and a bad GCOMP_WAIT makes the
// Communicator throw naming it, on every rank alike.
TEST(WaitPolicy, EveryPolicyGivesTheSameSums) {
  const Codec codec("topk:ratio=0.1");
  const auto x = test::integers(5000, 7);
  const auto want = test::mpi_sum(test::contribution(codec, x, 0));
  AllreduceOptions applied;
  applied.allow_uncompressed = false;
  for (const WaitPolicy p : {WaitPolicy::spin, WaitPolicy::yield, WaitPolicy::sleep}) {
    set_wait_policy(p);
    EXPECT_EQ(wait_policy(), p);
    EXPECT_EQ(effective_wait_policy(), p);
    EXPECT_EQ(parse_wait_policy(wait_policy_name(p)), p);
    for (const Algorithm a : {Algorithm::sparse_allgather, Algorithm::sparse_recursive_doubling,
                              Algorithm::sparse_split, Algorithm::dense}) {
      applied.algorithm = a;
      std::vector<float> out(x.size());
      world().allreduce(x, out, codec, nullptr, applied);
      EXPECT_EQ(out, want) << wait_policy_name(p) << " " << algorithm_name(a);
    }
  }
  set_wait_policy(WaitPolicy::automatic);
  EXPECT_EQ(wait_policy(), WaitPolicy::automatic);
  EXPECT_NE(effective_wait_policy(), WaitPolicy::automatic);
  EXPECT_EQ(status_of([] { parse_wait_policy("busy"); }), Status::invalid_argument);
}

TEST(WaitPolicy, EnvironmentDecidesAutomatic) {
  set_wait_policy(WaitPolicy::automatic);
  ASSERT_EQ(setenv("GCOMP_WAIT", "sleep", 1), 0);
  {
    Communicator c(MPI_COMM_WORLD);
    EXPECT_EQ(effective_wait_policy(), WaitPolicy::sleep);
    std::vector<float> x(100, 1.0f);
    c.allreduce(x, Codec("none"));
    EXPECT_EQ(x[0], static_cast<float>(size()));
  }
  ASSERT_EQ(setenv("GCOMP_WAIT", "busy", 1), 0);
  std::string msg;
  EXPECT_EQ(status_of([] { Communicator c(MPI_COMM_WORLD); }, &msg), Status::invalid_argument);
  EXPECT_NE(msg.find("GCOMP_WAIT"), std::string::npos) << msg;
  EXPECT_NE(msg.find("busy"), std::string::npos) << msg;
  // An explicit policy is not overridden by the environment.
  set_wait_policy(WaitPolicy::yield);
  {
    Communicator c(MPI_COMM_WORLD);
    EXPECT_EQ(effective_wait_policy(), WaitPolicy::yield);
  }
  unsetenv("GCOMP_WAIT");
  set_wait_policy(WaitPolicy::automatic);
}

}  // namespace
}  // namespace gcomp
