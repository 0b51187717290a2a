// The trainer under MPI: each rank takes its slice of the global batch, the two placements of
// error feedback agree within their rounding bound, the bytes it reports are the bytes handed to
// MPI, periodic averaging leaves the ranks' models apart between averages and the same mean on
// every rank after each, and a short run on Fashion-MNIST learns (when Debian's
// dataset-fashion-mnist is installed, as scripts/deps does).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <utility>

#include "mpi_util.hpp"
#include "optimizer.hpp"
#include "train.hpp"
#include "wire.hpp"

namespace gcomp::train {
namespace {

using test::rank;
using test::size;

// A learnable synthetic set: class c lights up its own block of pixels, plus noise.
Dataset synthetic(std::size_t count, std::uint32_t seed) {
  Dataset d;
  d.rows = d.cols = 28;
  d.count = count;
  d.images.resize(count * 784);
  d.labels.resize(count);
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> noise(0.0f, 0.3f);
  for (std::size_t s = 0; s < count; ++s) {
    const auto c = static_cast<std::uint8_t>(g() % 10);
    d.labels[s] = c;
    for (std::size_t i = 0; i < 784; ++i) d.images[s * 784 + i] = noise(g);
    for (std::size_t i = 0; i < 60; ++i) d.images[s * 784 + c * 70 + i] += 0.7f;
  }
  return d;
}

std::vector<float> flat(Model& m) {
  std::vector<float> all;
  for (Param* p : m.params()) all.insert(all.end(), p->value.begin(), p->value.end());
  return all;
}

// Bytes one rank hands to MPI per step for the MLP: the weights' bucket (fc1, fc2, fc3) and the
// biases' bucket, each with its agreement, an allreduce of 96 bytes counted as 2 * 96. A dense
// bucket of n floats counts the volume of a bandwidth-optimal allreduce, 2 (P-1)/P * 4n rounded
// down; a sparse_allgather one sends its payload to each peer after its 8-byte size.
constexpr std::uint64_t kWeights = 784 * 512 + 512 * 256 + 256 * 10, kBiases = 512 + 256 + 10;
std::uint64_t dense_bucket(std::uint64_t n, std::uint64_t p) {
  return 2 * 96 + 2 * (p - 1) * 4 * n / p;
}
std::uint64_t gathered_bucket(std::uint64_t payload, std::uint64_t p) {
  return 2 * 96 + (p - 1) * (8 + payload);
}

// A top-k payload of the weights: its indices packed, between a width byte per 128 indices
// (every gap the same width 0, the least) and max_bytes (every block at the widest).
struct PayloadRange {
  std::uint64_t least, most;
};
PayloadRange topk_payload(const Codec& codec, std::uint64_t n) {
  const std::uint64_t k = codec.selected(n);
  return {detail::header_bytes(detail::Layout{16, 2}) + (k + 127) / 128 + 4 * k,
          codec.max_bytes(n)};
}

// Data parallelism: in every step, the ranks' local batches (in rank order) are the global batch
// one rank with ranks x batch samples per step would take, from an epoch order that is a
// permutation shared by all ranks. (Whole runs of P ranks and of one rank are not compared: the
// same mathematics rounds differently with other matrix shapes and summation orders, and a
// ReLU at the edge of zero can turn a rounding difference into any difference at all.)
TEST(Trainer, RanksTakeTheirSliceOfTheGlobalBatch) {
  Config c;
  c.batch = 5;
  c.seed = 3;
  Config one = c;
  one.batch = c.batch * static_cast<std::size_t>(size());
  const std::size_t n = 1003;
  for (int epoch = 0; epoch < 3; ++epoch) {
    const std::vector<std::size_t> order = epoch_order(c, n, epoch);
    std::vector<std::size_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(sorted[i], i) << "not a permutation";
    std::vector<float> as_floats(order.begin(), order.end());
    EXPECT_TRUE(test::same_on_all_ranks(as_floats)) << "epoch " << epoch;
    if (epoch > 0) EXPECT_NE(order, epoch_order(c, n, epoch - 1));
    const std::size_t steps = n / one.batch;
    for (std::size_t s = 0; s < steps; ++s) {
      const auto mine = local_batch(c, order, s, rank(), size());
      ASSERT_EQ(mine.size(), c.batch);
      std::vector<unsigned long long> ids(mine.begin(), mine.end()), all(one.batch);
      MPI_Allgather(ids.data(), static_cast<int>(c.batch), MPI_UNSIGNED_LONG_LONG, all.data(),
                    static_cast<int>(c.batch), MPI_UNSIGNED_LONG_LONG, MPI_COMM_WORLD);
      const auto global = local_batch(one, order, s, 0, 1);
      ASSERT_TRUE(std::equal(all.begin(), all.end(), global.begin(), global.end())) << "step " << s;
    }
  }
}

// The same seed trains the same model, bit for bit, wherever the heap puts the tensors: two runs
// in one process, the second with its allocations shifted by a few floats.
TEST(Trainer, DeterministicForASeed) {
  const Dataset train = synthetic(320, 10), test = synthetic(50, 11);
  for (const char* codec : {"none", "topk:ratio=0.01", "qsgd:bits=4"}) {
    Config c;
    c.codec = codec;
    c.epochs = 1;
    c.batch = 8;
    std::vector<float> first;
    for (int shift = 0; shift < 2; ++shift) {
      std::vector<std::unique_ptr<float[]>> pads;  // moves later allocations along the heap
      for (int i = 0; i < 64 * shift; ++i) pads.emplace_back(new float[1 + i % 7]);
      Model m(c.model, 28, 28, 5);
      run(c, train, test, test::world(), m);
      if (shift == 0) {
        first = flat(m);
      } else {
        EXPECT_TRUE(flat(m) == first) << codec << ": the second run trained another model";
      }
    }
  }
}

// Error feedback on each rank's velocity against one momentum of the averaged gradient, without
// compression: the same update up to rounding. From zero momentum the first step is the same
// bits (m_r = 0 * mu + g_r = g_r exactly, and both paths make the same allreduce of g). In the
// second, the velocity path sends m_r = fl(fl(mu g1_r) + g2_r) and averages (a sum in MPI's order,
// P - 1 roundings, then a product with fl(1/P)); the gradient path averages g1 and g2 the same
// way and forms fl(fl(mu a1) + a2). Each is (1/P) sum_r (mu g1_r + g2_r), each term with a
// relative error of at most gamma_{P+3} (gamma_k = k u / (1 - k u), u = 2^-24), so the two steps
// differ by at most D = 2 gamma_{P+3} A, A = (1/P) sum_r (mu |g1_r| + |g2_r|). The values then
// differ by at most lr D + 2 u lr A (1 + gamma_{P+3}) from rounding lr * step, times (1 + u), plus
// one rounding of each value, u (|w_a| + |w_b|) (1 + 2u).
TEST(Trainer, VelocityAndGradientFeedbackAgreeWithoutCompression) {
  const std::size_t sizes[2] = {3000, 10};  // a weight and a bias
  Config c;
  c.codec = "none";
  c.algorithm = Algorithm::dense;
  c.momentum = 0.9;
  const double lr = 0.1;
  Param a[2], b[2], d[2];
  std::mt19937 init(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int i = 0; i < 2; ++i) {
    a[i].value.resize(sizes[i]);
    for (float& v : a[i].value) v = normal(init);
    a[i].grad.assign(sizes[i], 0.0f);
    b[i] = a[i];
    d[i] = a[i];
  }
  c.ef_on_velocity = true;
  Optimizer on_velocity(c, {&a[0], &a[1]});
  c.ef_scaled_by_lr = true;
  Optimizer on_update(c, {&d[0], &d[1]});
  c.ef_scaled_by_lr = false;
  c.ef_on_velocity = false;
  Optimizer on_gradient(c, {&b[0], &b[1]});
  // Two steps' gradients, different on every rank and of different scales along the tensor.
  std::mt19937 g(77 + static_cast<std::uint32_t>(rank()));
  std::vector<float> grads[2][2];
  for (auto& step : grads) {
    for (int i = 0; i < 2; ++i) {
      step[i].resize(sizes[i]);
      for (std::size_t k = 0; k < sizes[i]; ++k) step[i][k] = normal(g) * (1.0f + k % 7);
    }
  }
  EpochRecord stats;
  for (int step = 0; step < 2; ++step) {
    for (int i = 0; i < 2; ++i) {
      a[i].grad = grads[step][i];
      b[i].grad = grads[step][i];
      d[i].grad = grads[step][i];
    }
    on_velocity.step(test::world(), lr, true, 1.0, static_cast<std::uint64_t>(step), stats);
    on_gradient.step(test::world(), lr, true, 1.0, static_cast<std::uint64_t>(step), stats);
    on_update.step(test::world(), lr, true, 1.0, static_cast<std::uint64_t>(step), stats);
    if (step == 0) {
      for (int i = 0; i < 2; ++i) EXPECT_EQ(a[i].value, b[i].value) << "first step, tensor " << i;
    }
  }
  const double u = 0x1p-24;
  const double p = size();
  const double gamma = (p + 3) * u / (1 - (p + 3) * u);
  for (int i = 0; i < 2; ++i) {
    std::vector<double> mine(sizes[i]), sum(sizes[i]);
    for (std::size_t k = 0; k < sizes[i]; ++k) {
      mine[k] = c.momentum * std::fabs(grads[0][i][k]) + std::fabs(grads[1][i][k]);
    }
    MPI_Allreduce(mine.data(), sum.data(), static_cast<int>(sizes[i]), MPI_DOUBLE, MPI_SUM,
                  MPI_COMM_WORLD);
    // The same bound for the update form (lr m_r summed: one rounding of lr m_r per rank more,
    // inside gamma's p + 3).
    for (const Param* other : {&b[i], &d[i]}) {
      std::size_t bad = 0;
      for (std::size_t k = 0; k < sizes[i]; ++k) {
        const double big_a = sum[k] / p;
        const double bound =
            (1 + u) * (lr * 2 * gamma * big_a + 2 * u * lr * big_a * (1 + gamma)) +
            u * (1 + 2 * u) * (std::fabs(a[i].value[k]) + std::fabs(other->value[k]));
        bad += !(std::fabs(static_cast<double>(a[i].value[k]) - other->value[k]) <= bound);
      }
      EXPECT_EQ(bad, 0u) << "tensor " << i << (other == &d[i] ? " (update)" : " (gradient)");
    }
  }
}

// A run whose bytes the tests count exactly: top-k 1% through sparse_allgather, 16 samples per
// rank and step, on 64 per rank.
struct CountedRun {
  Config c;
  Dataset train;
  History h;
};
CountedRun counted_topk_run(int epochs, int warmup_epochs, std::uint32_t data_seed,
                            std::uint32_t model_seed) {
  CountedRun r;
  r.train = synthetic(64 * static_cast<std::size_t>(size()), data_seed);
  const Dataset test = synthetic(50, data_seed + 1);
  r.c.codec = "topk:ratio=0.01";
  r.c.epochs = epochs;
  r.c.warmup_epochs = warmup_epochs;
  r.c.batch = 16;
  r.c.algorithm = Algorithm::sparse_allgather;
  Model model(r.c.model, 28, 28, model_seed);
  r.h = run(r.c, r.train, test, test::world(), model);
  return r;
}

TEST(Trainer, BytesAreThePayloadsHandedToMpi) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks";
  const auto [c, train, h] = counted_topk_run(1, 0, 4, 1);
  // Per step: the weights (535040 floats) as one top-k payload, the biases (778) dense.
  const std::uint64_t p = static_cast<std::uint64_t>(size());
  const PayloadRange w = topk_payload(Codec(c.codec), kWeights);
  const std::uint64_t steps = train.count / (c.batch * p);
  const double sent = h.epochs.back().bytes_sent_per_rank;
  EXPECT_GE(sent, static_cast<double>(steps * (gathered_bucket(w.least, p) + dense_bucket(kBiases, p))));
  EXPECT_LE(sent, static_cast<double>(steps * (gathered_bucket(w.most, p) + dense_bucket(kBiases, p))));
  EXPECT_DOUBLE_EQ(h.epochs.back().dense_bytes_per_rank,
                   static_cast<double>(steps) * 2 * static_cast<double>(p - 1) /
                       static_cast<double>(p) * 4 * static_cast<double>(kWeights + kBiases));
}

TEST(Trainer, WarmUpEpochsAreDense) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks";
  const auto [c, train, h] = counted_topk_run(2, 1, 12, 6);
  const std::uint64_t p = static_cast<std::uint64_t>(size());
  const std::uint64_t steps = train.count / (c.batch * p);
  // Epoch 1: both buckets dense, uncompressed.
  const std::uint64_t dense = dense_bucket(kWeights, p) + dense_bucket(kBiases, p);
  EXPECT_EQ(h.epochs[0].bytes_sent_per_rank, static_cast<double>(steps * dense));
  // Epoch 2: the weights compressed.
  const PayloadRange w = topk_payload(Codec(c.codec), kWeights);
  const double second = h.epochs[1].bytes_sent_per_rank - h.epochs[0].bytes_sent_per_rank;
  EXPECT_GE(second, static_cast<double>(steps * (gathered_bucket(w.least, p) + dense_bucket(kBiases, p))));
  EXPECT_LE(second, static_cast<double>(steps * (gathered_bucket(w.most, p) + dense_bucket(kBiases, p))));
}

TEST(Trainer, LearnsFashionMnistInOneShortEpoch) {
  if (size() != 2) GTEST_SKIP() << "the quick run is defined for two ranks";
  if (!std::filesystem::exists(kDefaultDataDir)) {
    GTEST_SKIP() << "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)";
  }
  const FashionMnist fm = load_fashion_mnist(kDefaultDataDir);
  for (const char* codec : {"none", "topk:ratio=0.01"}) {
    Config c;
    c.codec = codec;
    c.epochs = 1;
    c.subset = 8000;
    c.test_subset = 2000;
    Model model(c.model, fm.train.rows, fm.train.cols, c.seed);
    const History h = run(c, fm.train, fm.test, test::world(), model);
    const EpochRecord& r = h.epochs.back();
    EXPECT_GT(r.test_accuracy, 0.65) << codec << " (chance is 0.10)";
    const double ratio = r.dense_bytes_per_rank / r.bytes_sent_per_rank;
    if (std::string(codec) == "none") {
      // The float32 allreduce of both buckets and their agreements, every step.
      const std::uint64_t steps = c.subset / (c.batch * 2);
      EXPECT_EQ(r.bytes_sent_per_rank, static_cast<double>(steps * (dense_bucket(kWeights, 2) +
                                                                    dense_bucket(kBiases, 2))));
    } else {
      EXPECT_GE(ratio, 40.0) << codec;  // 1% of the weights as (index, value) pairs: ~50x
    }
  }
}

// AdamW through CompressedAdam with sign on compressed_reduce_scatter, 2 epochs of 16 steps on
// separable synthetic classes; schedule sets the Config's warm-up or zero_one. Checks that the
// run learns them (chance is 0.1) and ends with the same bits on every rank; returns the bytes
// per rank of epoch 1 and of epoch 2.
std::pair<double, double> adamw_epochs(const std::function<void(Config&)>& schedule) {
  const Dataset train = synthetic(256 * static_cast<std::size_t>(size()), 21);
  const Dataset test = synthetic(200, 22);
  Config c;
  c.optimizer = "adamw";
  c.lr = 2e-3;
  c.weight_decay = 0.01;
  c.codec = "sign";
  schedule(c);
  c.epochs = 2;
  c.batch = 16;
  c.algorithm = Algorithm::compressed_reduce_scatter;
  Model model(c.model, 28, 28, 3);
  const History h = run(c, train, test, test::world(), model);
  EXPECT_GT(h.epochs.back().test_accuracy, 0.8);
  const std::vector<float> mine = flat(model);
  std::vector<float> root = mine;
  MPI_Bcast(root.data(), static_cast<int>(root.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  EXPECT_EQ(root, mine);
  const double first = h.epochs[0].bytes_sent_per_rank;
  return {first, h.epochs[1].bytes_sent_per_rank - first};
}

TEST(Trainer, OneBitAdamLearnsWithTheSameParametersOnEveryRank) {
  // 1-bit Adam: 8 exact steps, then the momentum compressed.
  const auto [first, second] = adamw_epochs([](Config& c) { c.warmup_steps = 8; });
  // Epoch 1 holds the 8 exact steps, epoch 2 only compressed ones.
  if (size() > 1) EXPECT_LT(second, first / 4);
}

TEST(Trainer, ZeroOneAdamLearnsAndSendsLessOnceItsVarianceIsFrozen) {
  // 0/1 Adam's schedule: 2 exact steps, refreshes at 4 and 6 (every 2nd step) and 10 (every
  // 4th), frozen after 10; local steps synchronized every step from 11, every 2nd from 15,
  // every 4th from 19, so the last step (32) is between two synchronizations: the epoch's end
  // synchronizes ahead of the schedule, and the ranks end with the same bits.
  Config z;
  z.zero_one = "10,2,4,4";
  const AdamSchedule s = adam_schedule(z);
  ASSERT_EQ(s.variance_steps(32), 5u);
  ASSERT_TRUE(s.local(32) && !s.synchronizes(32));
  const auto [first, second] = adamw_epochs([](Config& c) { c.zero_one = "10,2,4,4"; });
  // Epoch 1 holds the 5 exact steps; epoch 2 (steps 17-32) 5 synchronizations, compressed
  // (18, 22, 26, 30 and the epoch's end).
  if (size() > 1) EXPECT_LT(second, first / 8);
}

TEST(Trainer, AdamsOptionsAreChecked) {
  Config c;
  c.optimizer = "adamw";
  EXPECT_THROW(validate(c), Error);  // warmup_steps 0
  c.warmup_steps = 10;
  validate(c);
  c.warmup_epochs = 1;
  EXPECT_THROW(validate(c), Error);  // SGD's warm-up
  c.warmup_epochs = 0;
  c.codec = "dgc:ratio=0.01";
  EXPECT_THROW(validate(c), Error);
  c.codec = "sign";
  c.beta2 = 1.0;
  EXPECT_THROW(validate(c), Error);
  c.beta2 = 0.999;
  c.optimizer = "lamb";
  EXPECT_THROW(validate(c), Error);
  c.optimizer = "adamw";
  c.zero_one = "100,4";
  EXPECT_THROW(validate(c), Error);  // and warmup_steps: two warm-ups
  c.warmup_steps = 0;
  validate(c);
  EXPECT_EQ(adam_schedule(c), AdamSchedule::zero_one(100, 4));
  for (const char* bad : {"", "x", "100,", "1,2,3,4,5", "100,4,0"}) {
    c.zero_one = bad;
    EXPECT_THROW(validate(c), Error) << bad;
  }
  c.zero_one = "100";
  c.optimizer = "sgd";
  EXPECT_THROW(validate(c), Error);  // zero_one is Adam's
  c.zero_one.clear();
  c.warmup_steps = 10;
  EXPECT_THROW(validate(c), Error);  // warmup_steps is Adam's
}

TEST(Trainer, DgcWarmsUpItsSparsity) {
  EXPECT_DOUBLE_EQ(dgc_ratio(0, 0.001), 0.25);
  EXPECT_DOUBLE_EQ(dgc_ratio(1, 0.001), 0.0625);
  EXPECT_DOUBLE_EQ(dgc_ratio(2, 0.001), 0.015625);
  EXPECT_DOUBLE_EQ(dgc_ratio(3, 0.001), 0.004);
  EXPECT_DOUBLE_EQ(dgc_ratio(4, 0.001), 0.001);
  const Dataset train = synthetic(640, 6), test = synthetic(200, 7);
  Config c;
  c.codec = "dgc:ratio=0.01,clip=5";
  c.epochs = 2;
  c.batch = 8;
  Model model(c.model, 28, 28, 2);
  const History h = run(c, train, test, test::world(), model);
  EXPECT_DOUBLE_EQ(h.epochs[0].sparsity, 0.75);
  EXPECT_GT(h.epochs.back().test_accuracy, 0.5);  // the synthetic classes are easy
  EXPECT_THROW(validate(Config{.codec = "dgc:ratio=2"}), Error);
  EXPECT_THROW(validate(Config{.codec = "dgc:rate=0.1"}), Error);
  EXPECT_THROW(validate(Config{.codec = "dgc"}), Error);
}

// Periodic averaging with period 1, or with every step before period_from, is the synchronized
// run bit for bit: the same parameters and bytes as the defaults, and no average.
TEST(Trainer, PeriodOneIsTheSynchronizedRunBitForBit) {
  const Dataset train = synthetic(32 * static_cast<std::size_t>(size()), 30);
  const Dataset test = synthetic(50, 31);
  Config c;
  c.codec = "topk:ratio=0.01";  // with error feedback: the residuals stay the gradients'
  c.epochs = 1;
  c.batch = 8;  // 4 steps
  Config one = c;
  one.period = 1;
  Config never = c;  // local from step 4: after the run
  never.period = 3;
  never.period_from = 4;
  std::vector<float> first;
  double bytes = 0;
  for (const Config* k : {&c, &one, &never}) {
    Model m(k->model, 28, 28, 8);
    const History h = run(*k, train, test, test::world(), m);
    EXPECT_EQ(h.epochs.back().averages, 0u);
    if (k == &c) {
      first = flat(m);
      bytes = h.epochs.back().bytes_sent_per_rank;
      continue;
    }
    EXPECT_TRUE(flat(m) == first) << "period " << k->period;
    EXPECT_EQ(h.epochs.back().bytes_sent_per_rank, bytes) << "period " << k->period;
  }
}

// Period 3 from step 2, without compression: steps 0 and 1 synchronized, 2..4 local, an average
// after 5 steps, 5..7 local, an average after 8, then step 8 local and the epoch's end averages
// ahead of the schedule. Local steps send nothing and leave the ranks' parameters apart; after
// an average they are the same bits on every rank and the mean of the ranks' parameters before
// it, p' = fl(a - avg), avg the allreduce's average of x_r = fl(a - p_r), a the anchor (the
// parameters at the last synchronization, the same on every rank). The bound:
// |x_r - (a - p_r)| <= u |a - p_r| (the change rounded once), so u S with S = mean_r |a - p_r|;
// the average, P - 1 additions in MPI's order and the product with fl(1/P), is within
// gamma_{P+1} (1/P) sum_r |x_r| <= gamma_{P+1} (1 + u) S of (1/P) sum_r x_r (gamma_k =
// k u / (1 - k u), u = 2^-24); the final subtraction adds u |a - avg| <= u |p'| / (1 - u). As
// a - (1/P) sum_r (a - p_r) is mean_r p_r exactly, |p' - mean_r p_r| is at most their sum (and
// the reference's own double rounding, P 2^-53 mean_r |p_r|).
TEST(Trainer, PeriodicAveragesAreTheMeanOfTheRanksModels) {
  const std::size_t sizes[2] = {3000, 10};  // a weight (its own bucket) and a bias (dense)
  Config c;
  c.codec = "none";
  c.momentum = 0.9;
  c.period = 3;
  c.period_from = 2;
  validate(c);
  Param w[2];
  std::mt19937 init(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int i = 0; i < 2; ++i) {
    w[i].value.resize(sizes[i]);
    for (float& v : w[i].value) v = normal(init);
    w[i].grad.assign(sizes[i], 0.0f);
  }
  Optimizer opt(c, {&w[0], &w[1]});
  const auto values = [&] {
    std::vector<float> all = w[0].value;
    all.insert(all.end(), w[1].value.begin(), w[1].value.end());
    return all;
  };
  const bool several = size() > 1;
  const double u = 0x1p-24, p = size();
  const double gamma = (p + 1) * u / (1 - (p + 1) * u);
  std::mt19937 g(40 + static_cast<std::uint32_t>(rank()));
  EpochRecord stats;
  double step_bytes = 0;
  std::vector<float> anchor;
  // An average just ran: the same bits everywhere, within the bound of the mean of before.
  const auto check_average = [&](const std::vector<float>& before, std::uint64_t taken) {
    const std::vector<float> after = values();
    EXPECT_TRUE(test::same_on_all_ranks(after)) << "after " << taken << " steps";
    const std::size_t n = after.size();
    std::vector<double> mine(2 * n), sum(2 * n);
    for (std::size_t k = 0; k < n; ++k) {
      mine[k] = before[k];
      mine[n + k] = std::fabs(static_cast<double>(anchor[k]) - before[k]);
    }
    MPI_Allreduce(mine.data(), sum.data(), static_cast<int>(2 * n), MPI_DOUBLE, MPI_SUM,
                  MPI_COMM_WORLD);
    std::size_t bad = 0;
    for (std::size_t k = 0; k < n; ++k) {
      const double mean = sum[k] / p, s = sum[n + k] / p;
      const double bound = u * s + gamma * (1 + u) * s + u * std::fabs(after[k]) / (1 - u) +
                           p * 0x1p-53 * (std::fabs(mean) + s);
      bad += !(std::fabs(after[k] - mean) <= bound);
    }
    EXPECT_EQ(bad, 0u) << "after " << taken << " steps";
    anchor = after;
  };
  for (std::uint64_t step = 0; step < 9; ++step) {
    for (int i = 0; i < 2; ++i) {
      for (float& x : w[i].grad) x = normal(g);
    }
    const double bytes = stats.bytes_sent_per_rank;
    opt.step(test::world(), 0.05, true, 1.0, step, stats);
    EXPECT_EQ(opt.local(step), step >= 2) << "step " << step;
    if (step < 2) {
      if (several) EXPECT_GT(stats.bytes_sent_per_rank, bytes) << "step " << step;
      step_bytes = stats.bytes_sent_per_rank - bytes;
      EXPECT_TRUE(test::same_on_all_ranks(values())) << "step " << step;
      anchor = values();
      EXPECT_FALSE(opt.average_if_due(test::world(), stats));
      continue;
    }
    EXPECT_EQ(stats.bytes_sent_per_rank, bytes) << "local step " << step << " sent";
    if (several) EXPECT_FALSE(test::same_on_all_ranks(values())) << "step " << step;
    const std::vector<float> before = values();
    const bool due = step == 4 || step == 7;
    EXPECT_EQ(opt.average_if_due(test::world(), stats), due) << "after step " << step;
    if (!due) continue;
    // The same collective as a synchronized step's: the same tensors, codec and algorithm.
    EXPECT_EQ(stats.bytes_sent_per_rank - bytes, step_bytes) << "the average after " << step;
    check_average(before, step + 1);
  }
  EXPECT_EQ(stats.averages, 2u);
  // Step 8 was local: the epoch's end averages (once).
  const std::vector<float> before = values();
  opt.synchronize(test::world(), stats);
  EXPECT_EQ(stats.averages, 3u);
  check_average(before, 9);
  opt.synchronize(test::world(), stats);
  EXPECT_EQ(stats.averages, 3u) << "the ranks agreed already";
}

// Top-k 1% with error feedback, averaging every 2 steps from step 1 with DiLoCo's outer step and
// the velocities averaged: the ranks agree after every average, and the averages' residuals hold
// what top-k left. Then gcomp-train's loop: averages at their steps and the epoch's end, and
// the same model on every rank at the end.
TEST(Trainer, PeriodicAveragingThroughTopkKeepsResiduals) {
  Config c;
  c.codec = "topk:ratio=0.01";
  c.period = 2;
  c.period_from = 1;
  c.outer_lr = 0.7;
  c.outer_momentum = 0.9;
  c.momentum_at_average = "average";
  Param w;
  std::mt19937 g(60 + static_cast<std::uint32_t>(rank()));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  w.value.assign(4000, 0.5f);
  w.grad.resize(w.value.size());
  Optimizer opt(c, {&w});
  EpochRecord stats;
  for (std::uint64_t step = 0; step < 5; ++step) {
    for (float& x : w.grad) x = normal(g);
    opt.step(test::world(), 0.05, true, 1.0, step, stats);
    if (opt.average_if_due(test::world(), stats)) {
      EXPECT_TRUE(test::same_on_all_ranks(w.value)) << "after step " << step;
    }
  }
  EXPECT_EQ(stats.averages, 2u);  // after 3 and 5 steps
  ASSERT_EQ(opt.average_feedback().size(), 1u);
  const std::span<const float> e = opt.average_feedback()[0].residual();
  EXPECT_TRUE(std::any_of(e.begin(), e.end(), [](float x) { return x != 0.0f; }));

  const Dataset train = synthetic(64 * static_cast<std::size_t>(size()), 32);
  const Dataset test = synthetic(100, 33);
  Config t;
  t.codec = "topk:ratio=0.01";
  t.epochs = 1;
  t.batch = 8;  // 8 steps: averages after 3 and 6, and at the epoch's end
  t.period = 3;
  Model m(t.model, 28, 28, 4);
  const History h = run(t, train, test, test::world(), m);
  EXPECT_EQ(h.epochs.back().averages, 3u);
  EXPECT_TRUE(test::same_on_all_ranks(flat(m)));
  EXPECT_GT(h.epochs.back().test_accuracy, 0.2);  // chance is 0.1
}

// Streaming (period 4 from step 1, 2 fragments, each merged T = 1 or 2 steps after it starts;
// at T = 2 paced, each fragment sent in two parts, cut at rows 25 and 75): a weight of 100 rows
// of 30 and a bias, 3010 values, cut at row 50 (1500 | 1510). Fragment 0 starts after the local
// steps 4, 8 (steps 5, 9 taken), fragment 1 after 2, 6, 10 (3, 7, 11); each merged T steps
// later. The reference, in double from every rank's values (gathered): at a start
// x_r = a - v_r + c_r, at the merge a -= mean_r x_r, the fragment's values = a on every rank and
// c_r = v_r(start) - v_r(merge); the other values untouched (each rank's own). SGD without
// momentum on a grid of 1/8 with integer gradients and lr 1/8: exact in float32 for P a power of
// two (the reference bit for bit); for other P within 8 u (|a| + S + max |c|) of it, S the
// mean |x_r| (the changes, the carry's addition, the mean's sum and product, the subtraction,
// each once).
class StreamingOverlap : public ::testing::TestWithParam<std::uint64_t> {};

TEST_P(StreamingOverlap, AveragesEachFragmentAtItsStepAndMergesItLater) {
  const std::uint64_t overlap = GetParam();
  int level = 0;
  MPI_Query_thread(&level);
  if (level < MPI_THREAD_MULTIPLE) GTEST_SKIP() << "the checks gather while a call is out";
  Config c;
  c.codec = "none";
  c.momentum = 0;
  c.period = 4;
  c.period_from = 1;
  c.fragments = 2;
  c.overlap_steps = overlap;
  c.algorithm = Algorithm::allgather;
  validate(c);
  Param w, b;
  w.value.resize(3000);
  w.shape = {100, 30};
  b.value.resize(10);
  std::mt19937 init(5);
  for (float& v : w.value) v = static_cast<float>(static_cast<int>(init() % 64) - 32) / 8;
  for (float& v : b.value) v = static_cast<float>(static_cast<int>(init() % 64) - 32) / 8;
  w.grad.resize(w.value.size());
  b.grad.resize(b.value.size());
  Optimizer opt(c, {&w, &b});
  const std::size_t n = 3010, cut = 1500, p = static_cast<std::size_t>(size());
  const auto values = [&] {
    std::vector<float> all = w.value;
    all.insert(all.end(), b.value.begin(), b.value.end());
    return all;
  };
  const auto gather = [&](const std::vector<float>& mine) {  // P x n, rank-major
    std::vector<float> all(p * n);
    MPI_Allgather(mine.data(), static_cast<int>(n), MPI_FLOAT, all.data(), static_cast<int>(n),
                  MPI_FLOAT, MPI_COMM_WORLD);
    return std::vector<double>(all.begin(), all.end());
  };
  const bool exact = (p & (p - 1)) == 0;
  const double u = 0x1p-24;
  std::mt19937 g(70 + static_cast<std::uint32_t>(rank()));
  EpochRecord stats;
  std::vector<double> anchor, carry(p * n, 0.0);  // the reference's
  struct Out { std::uint64_t merge_at; std::size_t lo, hi; std::vector<double> mean, start, s; };
  std::vector<Out> flights;
  std::uint64_t merges = 0;
  for (std::uint64_t step = 0; step < 12; ++step) {
    for (float& x : w.grad) x = static_cast<float>(g() % 7);
    for (float& x : b.grad) x = static_cast<float>(g() % 7);
    opt.step(test::world(), 0.125, true, 1.0, step, stats);
    const std::uint64_t taken = step + 1;
    std::vector<double> v = gather(values());  // after the step, before any average
    if (taken <= 1) {
      anchor.assign(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(n));
      opt.average_if_due(test::world(), stats);
      continue;
    }
    std::vector<double> bound(n, 0.0);
    std::vector<char> merged(n, 0);
    for (auto it = flights.begin(); it != flights.end();) {
      if (it->merge_at != taken) {
        ++it;
        continue;
      }
      for (std::size_t k = it->lo; k < it->hi; ++k) {
        anchor[k] -= it->mean[k - it->lo];
        double cmax = 0;
        for (std::size_t r = 0; r < p; ++r) {
          carry[r * n + k] = it->start[r * (it->hi - it->lo) + k - it->lo] - v[r * n + k];
          cmax = std::max(cmax, std::fabs(carry[r * n + k]));
          v[r * n + k] = anchor[k];
        }
        bound[k] = 8 * u * (std::fabs(anchor[k]) + it->s[k - it->lo] + cmax);
        merged[k] = 1;
      }
      it = flights.erase(it);
      ++merges;
    }
    const std::uint64_t k = taken - 1;
    for (std::size_t f = 0; f < 2; ++f) {
      const std::uint64_t offset = f * 4 / 2;
      if (k < offset || (k - offset) % 4 != 0) continue;
      Out o{taken + overlap, f == 0 ? 0 : cut, f == 0 ? cut : n, {}, {}, {}};
      const std::size_t m = o.hi - o.lo;
      o.mean.assign(m, 0.0);
      o.s.assign(m, 0.0);
      o.start.resize(p * m);
      for (std::size_t r = 0; r < p; ++r) {
        for (std::size_t e = 0; e < m; ++e) {
          const double x = anchor[o.lo + e] - v[r * n + o.lo + e] + carry[r * n + o.lo + e];
          carry[r * n + o.lo + e] = 0;
          o.mean[e] += x / static_cast<double>(p);
          o.s[e] += std::fabs(x) / static_cast<double>(p);
          o.start[r * m + e] = v[r * n + o.lo + e];
        }
      }
      flights.push_back(std::move(o));
    }
    opt.average_if_due(test::world(), stats);
    const std::vector<double> got = gather(values());
    std::size_t wrong = 0, apart = 0;
    for (std::size_t r = 0; r < p; ++r) {
      for (std::size_t e = 0; e < n; ++e) {
        const double a = got[r * n + e], want = v[r * n + e];
        if (!merged[e] || exact) {
          wrong += a != want;
        } else {
          wrong += !(std::fabs(a - want) <= bound[e]);
        }
        if (merged[e]) apart += a != got[e];  // the same bits as rank 0's
      }
    }
    EXPECT_EQ(wrong, 0u) << "after " << taken << " steps";
    EXPECT_EQ(apart, 0u) << "after " << taken << " steps";
    for (std::size_t e = 0; e < n; ++e) {
      if (merged[e]) anchor[e] = got[e];  // no error carried into the next average
    }
  }
  EXPECT_EQ(stats.averages, merges);
  // Started after 3, 5, 7, 9, 11; merged T steps later: by step 12 all (T = 1) or four (T = 2).
  EXPECT_EQ(merges, overlap == 1 ? 5u : 4u);
  ASSERT_EQ(flights.size(), overlap == 1 ? 0u : 1u);
  // What is in flight merged (its last part sent first), then every fragment averaged at once.
  opt.synchronize(test::world(), stats);
  EXPECT_TRUE(test::same_on_all_ranks(values()));
  EXPECT_EQ(stats.averages, merges + flights.size() + 1);
}

INSTANTIATE_TEST_SUITE_P(Trainer, StreamingOverlap, ::testing::Values(1u, 2u),
                         [](const auto& info) { return "T" + std::to_string(info.param); });

// fragments 1, overlap 0 given is periodic averaging as without them: the same values, bit for
// bit, and the same bytes (top-k with error feedback, DiLoCo's outer step, velocities averaged).
TEST(Trainer, OneFragmentWithoutOverlapIsPeriodicAveraging) {
  std::vector<float> result[2];
  double bytes[2] = {0, 0};
  for (int pass = 0; pass < 2; ++pass) {
    Config c;
    c.codec = "topk:ratio=0.05";
    c.period = 3;
    c.period_from = 1;
    c.outer_lr = 0.7;
    c.outer_momentum = 0.5;
    c.momentum_at_average = "average";
    if (pass == 1) {
      c.fragments = 1;
      c.overlap_steps = 0;
    }
    Param w;
    w.value.assign(2000, 0.25f);
    w.grad.resize(w.value.size());
    Optimizer opt(c, {&w});
    std::mt19937 g(80 + static_cast<std::uint32_t>(rank()));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    EpochRecord stats;
    for (std::uint64_t step = 0; step < 8; ++step) {
      for (float& x : w.grad) x = normal(g);
      opt.step(test::world(), 0.05, true, 1.0, step, stats);
      opt.average_if_due(test::world(), stats);
    }
    opt.synchronize(test::world(), stats);
    result[pass] = w.value;
    bytes[pass] = stats.bytes_sent_per_rank;
    EXPECT_EQ(stats.averages, 3u);  // after 4 and 7 steps, and at the end
  }
  EXPECT_TRUE(result[0] == result[1]);
  EXPECT_EQ(bytes[0], bytes[1]);
}

TEST(Trainer, PeriodicOptionsAreChecked) {
  const auto rejects = [](const Config& c, const std::string& flag) {
    std::string message;
    EXPECT_EQ(test::status_of([&] { validate(c); }, &message), Status::invalid_argument) << flag;
    EXPECT_NE(message.find(flag), std::string::npos) << message;
  };
  validate(Config{.period = 4});
  validate(Config{.period = 4,
                  .period_from = 100,
                  .outer_lr = 0.7,
                  .outer_momentum = 0.9,
                  .momentum_at_average = "average"});
  rejects(Config{.period = 0}, "--period");
  rejects(Config{.period = 4, .fragments = 0}, "--fragments");
  rejects(Config{.period = 4, .fragments = 5}, "--fragments");
  rejects(Config{.period = 4, .overlap_steps = 4}, "--overlap-steps");
  rejects(Config{.fragments = 2}, "--fragments");
  rejects(Config{.overlap_steps = 1}, "--overlap-steps");
  validate(Config{.period = 4, .fragments = 4, .overlap_steps = 3});
  rejects(Config{.period = 4, .outer_lr = 0}, "--outer-lr");
  rejects(Config{.period = 4, .outer_lr = std::numeric_limits<double>::infinity()}, "--outer-lr");
  rejects(Config{.period = 4, .outer_momentum = 1}, "--outer-momentum");
  rejects(Config{.period = 4, .outer_momentum = -0.1}, "--outer-momentum");
  rejects(Config{.period = 4, .momentum_at_average = "keep"}, "--momentum-at-average");
  // Settings of the averages without averages.
  rejects(Config{.period_from = 5}, "--period-from");
  rejects(Config{.outer_lr = 0.5}, "--outer-lr");
  rejects(Config{.outer_momentum = 0.9}, "--outer-momentum");
  rejects(Config{.momentum_at_average = "reset"}, "--momentum-at-average");
  // Local steps are momentum SGD's, and DGC's correction is the synchronized steps'.
  rejects(Config{.optimizer = "adamw", .warmup_steps = 4, .period = 4}, "--period");
  rejects(Config{.codec = "dgc:ratio=0.01", .period = 4}, "--period");
}

}  // namespace
}  // namespace gcomp::train
