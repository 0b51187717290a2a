// The trainer under MPI: data parallelism is exact (P ranks equal one rank with the same global
// batch), the bytes it reports are the bytes handed to MPI, and a short run on Fashion-MNIST
// learns (when Debian's dataset-fashion-mnist is installed, as scripts/deps does).
#include <filesystem>
#include <memory>
#include <random>

#include "mpi_util.hpp"
#include "train.hpp"

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

// The largest difference between two models' parameters, and the largest parameter of b.
struct Difference {
  double worst = 0, scale = 0;
};
Difference difference(Model& a, Model& b) {
  const auto x = flat(a), y = flat(b);
  Difference d;
  for (std::size_t i = 0; i < x.size(); ++i) {
    d.worst = std::max(d.worst, static_cast<double>(std::fabs(x[i] - y[i])));
    d.scale = std::max(d.scale, static_cast<double>(std::fabs(y[i])));
  }
  return d;
}

// Bytes one rank hands to MPI per step for the MLP: the weights' bucket (fc1, fc2, fc3) and the
// biases' bucket, each with its agreement, an allreduce of 72 bytes counted as 2 * 72. A dense
// bucket of n floats counts the volume of a bandwidth-optimal allreduce, 2 (P-1)/P * 4n rounded
// down; a sparse_allgather one sends its payload to each peer after its 8-byte size.
constexpr std::uint64_t kWeights = 784 * 512 + 512 * 256 + 256 * 10, kBiases = 512 + 256 + 10;
std::uint64_t dense_bucket(std::uint64_t n, std::uint64_t p) { return 144 + 2 * (p - 1) * 4 * n / p; }
std::uint64_t gathered_bucket(std::uint64_t payload, std::uint64_t p) {
  return 144 + (p - 1) * (8 + payload);
}

TEST(Trainer, RanksMatchOneRankWithTheSameGlobalBatch) {
  const Dataset train = synthetic(960, 1), test = synthetic(200, 2);
  Config c;
  c.codec = "none";
  c.epochs = 2;
  c.batch = 8;
  c.lr = 0.02;
  c.seed = 3;
  Model model(c.model, 28, 28, c.seed);
  run(c, train, test, test::world(), model);
  // The same global batch on one rank: a communicator of this rank alone.
  MPI_Comm self;
  MPI_Comm_split(MPI_COMM_WORLD, rank(), 0, &self);
  Difference d;
  {
    Communicator alone(self);
    Config one = c;
    one.batch = c.batch * static_cast<std::size_t>(size());
    Model single(c.model, 28, 28, c.seed);
    run(one, train, test, alone, single);
    d = difference(model, single);
  }
  MPI_Comm_free(&self);
  // Only the order of float sums differs (a mean over ranks of means over local batches against
  // one mean): a few ulps per step, 240 steps.
  EXPECT_LE(d.worst, 1e-5 * d.scale) << "largest parameter difference " << d.worst;
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

// Error feedback on each rank's velocity: the average of the ranks' momenta is the momentum of
// the averaged gradient, so without compression both placements train the same model.
TEST(Trainer, VelocityAndGradientFeedbackAgreeWithoutCompression) {
  const Dataset train = synthetic(480, 8), test = synthetic(100, 9);
  Config c;
  c.codec = "none";
  c.epochs = 2;
  c.batch = 8;
  c.algorithm = Algorithm::dense;
  Model a(c.model, 28, 28, 4), b(c.model, 28, 28, 4);
  c.ef_on_velocity = true;
  run(c, train, test, test::world(), a);
  c.ef_on_velocity = false;
  run(c, train, test, test::world(), b);
  const Difference d = difference(a, b);
  EXPECT_LE(d.worst, 1e-5 * d.scale) << "largest parameter difference " << d.worst;
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
  const std::uint64_t per_step =
      gathered_bucket(Codec(c.codec).max_bytes(kWeights), p) + dense_bucket(kBiases, p);
  const std::uint64_t steps = train.count / (c.batch * p);
  EXPECT_EQ(h.epochs.back().bytes_sent_per_rank, static_cast<double>(steps * per_step));
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
  const std::uint64_t sparse =
      gathered_bucket(Codec(c.codec).max_bytes(kWeights), p) + dense_bucket(kBiases, p);
  EXPECT_EQ(h.epochs[1].bytes_sent_per_rank - h.epochs[0].bytes_sent_per_rank,
            static_cast<double>(steps * sparse));
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
      EXPECT_NEAR(ratio, 1.0, 0.01) << codec;
    } else {
      EXPECT_GE(ratio, 40.0) << codec;  // 1% of the weights as (index, value) pairs: ~50x
    }
  }
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

}  // namespace
}  // namespace gcomp::train
