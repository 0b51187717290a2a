// The cost model's formulas (collectives/planning/cost_model.cpp, docs/algorithms.md) on synthetic inputs,
// where the expected seconds can be written down. No MPI: every rank runs the same checks.
#include "gcomp/cost_model.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <span>
#include <vector>

#include "algorithm_table.hpp"
#include "algorithms.hpp"
#include "gcomp/error.hpp"
#include "index_pack.hpp"
#include "network.hpp"

namespace gcomp {
namespace {

double union_of(double n, double k, double m) { return n * (1 - std::pow(1 - k / n, m)); }

// A stream entry of m entries among n: a float32 value and a packed index.
double entry_bytes(double m, double n) { return 4 + detail::expected_packed_index_bytes(m / n); }

// Recursive doubling at 3 ranks: the fold and unfold are single messages (at beta_one), the one
// round moves two streams at once (between beta_one and beta, at 2 of 3 flows), and the unfolded
// stream holds 3 ranks' entries, not 4.
TEST(CostModel, RecursiveDoublingFoldsAtOneFlow) {
  ModelInput in;
  in.n = 16777216;
  in.ranks = 3;
  in.sparse = true;
  in.sent = 167772;
  in.payload_bytes = 52 + in.sent * 8;
  in.network = {0.0, 24e-9, 24e-9, 8e-9, 24e-9, 0.0};
  const auto t = predict(in);
  const double two_flows = 8e-9 + (24e-9 - 8e-9) * 0.5;
  const auto stream = [&](double m) { return 8 + m * entry_bytes(m, in.n); };
  const double want = stream(in.sent) * 8e-9 + stream(union_of(in.n, in.sent, 2)) * two_flows +
                      stream(union_of(in.n, in.sent, 3)) * 8e-9;
  EXPECT_NEAR(t[static_cast<int>(Algorithm::sparse_recursive_doubling)], want, 1e-9 * want);
}

// MPI's allreduce per byte: beta_allreduce up to 4 MiB, beta_allreduce_large from 32 MiB, log-linear
// between; without the large fit, flat.
TEST(CostModel, AllreduceCostPerByteGrowsBeyondTheCaches) {
  ModelInput in;
  in.ranks = 2;
  in.codec_none = true;
  in.network = {0.0, 1e-9, 1e-9, 1e-9, 1e-9, 2e-9};
  const auto dense = [&](double n) {
    in.n = n;
    return predict(in)[static_cast<int>(Algorithm::dense)] / (2 * 0.5 * 4 * n);  // per byte
  };
  EXPECT_NEAR(dense(1 << 18), 1e-9, 1e-15);
  EXPECT_NEAR(dense(1 << 20), 1e-9, 1e-15);                    // 4 MiB
  EXPECT_NEAR(dense(std::ldexp(1.0, 20) * std::sqrt(8.0)), 1.5e-9, 1e-15);  // 4 MiB * 2^1.5
  EXPECT_NEAR(dense(1 << 23), 2e-9, 1e-15);                    // 32 MiB
  EXPECT_NEAR(dense(1 << 26), 2e-9, 1e-15);
  in.network.beta_allreduce_large = 0;
  EXPECT_NEAR(dense(1 << 26), 1e-9, 1e-15);
}

}  // namespace
}  // namespace gcomp

namespace gcomp {
namespace {

// The table's own check (run on its first use): the real table passes; a table with a row out
// of place, a row missing, a name twice, a row without a function, the wrong count or a state
// signature without the memory it hashes fails.
TEST(AlgorithmTable, TheCheckFindsEveryKindOfMistake) {
  const auto rows = detail::algorithm_rows();
  EXPECT_NO_THROW(detail::check_algorithm_table(rows));
  std::vector<const detail::AlgorithmRow*> t(rows.begin(), rows.end());
  const auto fails = [](std::vector<const detail::AlgorithmRow*> v) {
    EXPECT_THROW(detail::check_algorithm_table(v), Error);
  };
  auto swapped = t;
  std::swap(swapped[1], swapped[2]);
  fails(swapped);
  auto missing = t;
  missing.back() = nullptr;
  fails(missing);
  auto shorter = t;
  shorter.pop_back();
  fails(shorter);
  auto longer = t;
  longer.push_back(t.back());
  fails(longer);
  detail::AlgorithmRow twice = *t[1];
  twice.name = t[0]->name;
  auto named_twice = t;
  named_twice[1] = &twice;
  fails(named_twice);
  detail::AlgorithmRow no_run = *t[2];
  no_run.run = nullptr;
  auto without_run = t;
  without_run[2] = &no_run;
  fails(without_run);
  detail::AlgorithmRow undescribed = *t[3];
  undescribed.description = "";
  auto without_description = t;
  without_description[3] = &undescribed;
  fails(without_description);
  // A state signature of memory the row does not keep in the ErrorFeedback.
  const detail::AlgorithmRow* stateful = nullptr;
  for (const detail::AlgorithmRow* r : rows) {
    if (r->state_signature) stateful = r;
  }
  ASSERT_NE(stateful, nullptr);  // low_rank's
  detail::AlgorithmRow unjoined = *stateful;
  unjoined.join_state = nullptr;
  unjoined.split_state = nullptr;
  auto without_memory = t;
  without_memory[static_cast<std::size_t>(stateful->id) - 1] = &unjoined;
  fails(without_memory);
}

// The algorithm table: one row per algorithm, in the order of gcomp::Algorithm, each name
// parsed back to its algorithm, and auto weighing exactly the algorithms that suit the codec.
TEST(AlgorithmTable, RowsFollowTheEnumAndAutoWeighsWhatSuits) {
  const auto rows = detail::algorithm_rows();
  ASSERT_EQ(rows.size(), static_cast<std::size_t>(kAlgorithmCount - 1));
  for (std::size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(static_cast<int>(rows[i]->id), static_cast<int>(i) + 1) << rows[i]->name;
    EXPECT_EQ(&detail::algorithm_row(rows[i]->id), rows[i]);
    EXPECT_STREQ(algorithm_name(rows[i]->id), rows[i]->name);
    EXPECT_EQ(parse_algorithm(rows[i]->name), rows[i]->id);
    EXPECT_NE(rows[i]->predict, nullptr);
    EXPECT_NE(rows[i]->bytes, nullptr);
    EXPECT_NE(rows[i]->run, nullptr);
  }
  EXPECT_EQ(parse_algorithm("auto"), Algorithm::automatic);
  EXPECT_THROW(parse_algorithm("ring"), Error);
  ModelInput none, dense_codec, sparse_codec;
  none.codec_none = true;
  sparse_codec.sparse = true;
  const auto weighed = [](const ModelInput& in) {
    std::vector<Algorithm> a;
    for (int i = 0; i < kAlgorithmCount; ++i) {
      if (auto_candidate(static_cast<Algorithm>(i), in)) a.push_back(static_cast<Algorithm>(i));
    }
    return a;
  };
  EXPECT_EQ(weighed(none), std::vector<Algorithm>{Algorithm::dense});
  EXPECT_EQ(weighed(dense_codec),
            (std::vector<Algorithm>{Algorithm::dense, Algorithm::allgather,
                                    Algorithm::compressed_reduce_scatter}));
  EXPECT_EQ(weighed(sparse_codec),
            (std::vector<Algorithm>{Algorithm::dense, Algorithm::sparse_allgather,
                                    Algorithm::sparse_recursive_doubling,
                                    Algorithm::sparse_split}));
  // sparse_reduce_scatter (a global top-k) only where error feedback keeps what it leaves out.
  sparse_codec.error_feedback = true;
  EXPECT_EQ(weighed(sparse_codec),
            (std::vector<Algorithm>{Algorithm::dense, Algorithm::sparse_allgather,
                                    Algorithm::sparse_recursive_doubling,
                                    Algorithm::sparse_split, Algorithm::sparse_reduce_scatter}));
  // The sparse-only rows have no prediction for a dense codec.
  const auto t = predict(dense_codec);
  EXPECT_EQ(t[static_cast<int>(Algorithm::sparse_split)], kNotApplicable);
  EXPECT_EQ(t[static_cast<int>(Algorithm::automatic)], kNotApplicable);
}

}  // namespace
}  // namespace gcomp

namespace gcomp {
namespace {

// alpha's ping-pong pairs span two hosts wherever there are several.
TEST(NetworkMeasurement, PairsSpanHosts) {
  const auto pairs = [](std::vector<int> host_of) { return detail::deal_over_hosts(host_of); };
  EXPECT_EQ(pairs({0, 0, 0, 0}), (std::vector<int>{0, 1, 2, 3}));                    // one host
  EXPECT_EQ(pairs({0, 0, 0, 0, 4, 4, 4, 4}), (std::vector<int>{0, 4, 1, 5, 2, 6, 3, 7}));  // blocks
  EXPECT_EQ(pairs({0, 1, 0, 1}), (std::vector<int>{0, 1, 2, 3}));  // round-robin placement
  EXPECT_EQ(pairs({0, 0, 0, 3, 3}), (std::vector<int>{0, 3, 1, 4, 2}));  // uneven: 2 unpaired
}

}  // namespace
}  // namespace gcomp

namespace gcomp {
namespace {

// The model's bytes per rank for top-k 1% of 16M floats: sparse_reduce_scatter's stay near
// 2.1 k entries whatever P (the O(P) reports aside), while the union-based algorithms grow.
TEST(CostModel, SparseReduceScatterBytesDoNotGrowWithRanks) {
  ModelInput in;
  in.n = 16777216;
  in.sparse = true;
  in.sent = 167772;
  in.payload_bytes = 52 + in.sent * 8;
  in.network = network_for_rate(1e10, 5e-6);
  const auto bytes = [&](int p, Algorithm a) {
    in.ranks = p;
    return predict_bytes(in)[static_cast<int>(a)];
  };
  const double two = bytes(2, Algorithm::sparse_reduce_scatter);
  const double five = bytes(5, Algorithm::sparse_reduce_scatter);
  const double many = bytes(1024, Algorithm::sparse_reduce_scatter);
  // (P-1)/P k e(k) + (P-1) (1.1 k / P e'+ 104 + 16) + 16 (P-1), with e(k) the bytes of an entry
  // among k of n (1.1 k / P of n / P for e'): at P = 2, 0.5 k e(k) + 0.55 k e(1.1 k) + 136.
  const double k = in.sent, e = entry_bytes(k, in.n), e_kept = entry_bytes(1.1 * k, in.n);
  EXPECT_NEAR(two, 0.5 * k * e + 0.55 * k * e_kept + 136, 1.0);
  EXPECT_LT(many, 2.1 * k * e + 136 * 1023 + 1.0);
  EXPECT_LT(five / two, 1.75);  // 0.8 + 0.88 against 0.5 + 0.55 k entries
  EXPECT_GT(bytes(64, Algorithm::sparse_split), 4 * many);
  EXPECT_GT(bytes(64, Algorithm::sparse_allgather), 20 * many);
}

}  // namespace
}  // namespace gcomp

namespace gcomp {
namespace {

// powersgd's values=fp16 sends its factors as binary16: the low-rank row's model counts 2 bytes
// a factor value (4 with fp32), and so predicts fewer bytes.
TEST(LowRankModel, Fp16FactorsCountTwoBytes) {
  const MatrixShape m{512, 256};
  std::array<double, kAlgorithmCount> bytes[2];
  for (int half = 0; half < 2; ++half) {
    const Codec codec(half ? "powersgd:rank=4,values=fp16" : "powersgd:rank=4");
    ModelInput in;
    in.n = 512.0 * 256;
    in.ranks = 4;
    in.value_bytes = codec.properties().value_bytes;
    in.codec = &codec;
    in.shapes = std::span<const MatrixShape>(&m, 1);
    EXPECT_EQ(in.value_bytes, half ? 2 : 4);
    bytes[half] = predict_bytes(in);
  }
  const auto lr = static_cast<std::size_t>(Algorithm::low_rank);
  // No dense part: the factors (512 + 256) x 4 at 4 or 2 bytes, times 2 (P-1)/P.
  EXPECT_DOUBLE_EQ(bytes[0][lr], 2 * 3.0 / 4 * 4 * (512 + 256) * 4);
  EXPECT_DOUBLE_EQ(bytes[1][lr], bytes[0][lr] / 2);
}

}  // namespace
}  // namespace gcomp

namespace gcomp {
namespace {

// two_level applies only where the ranks span several hosts and some host has several; there,
// with shared memory or a fast network inside the host and a slow one between hosts, it is the
// model's choice for top-k and QSGD, and it is not where its steps inside a host go by messages
// as slow as the link (the unmeasured host network stands for both). Its bytes: across hosts the
// family's for n / W among H ranks, inside 2 (W-1)/W 4n.
TEST(TwoLevelModel, WhereItAppliesAndWhereItWins) {
  const auto two = static_cast<std::size_t>(Algorithm::two_level);
  for (const char* spec : {"topk:ratio=0.01", "qsgd:bits=4"}) {
    const Codec codec(spec);
    ModelInput in;
    in.n = 4194304;
    in.ranks = 4;
    in.codec = &codec;
    in.sparse = codec.properties().sparse;
    in.error_feedback = in.sparse;
    in.sent = static_cast<double>(codec.selected(4194304));
    in.payload_bytes = static_cast<double>(codec.max_bytes(4194304));
    in.compute = {2e-9, 1e-9, 2e-10, 2e-9};
    in.network = network_for_rate(1e9 / 2, 50e-6);  // 1 Gbit a host, shared by its 2 ranks
    EXPECT_EQ(predict(in)[two], kNotApplicable) << spec << ": hosts not known";
    in.hosts = 1;
    in.ranks_per_host = 4;
    EXPECT_EQ(predict(in)[two], kNotApplicable) << spec << ": one host";
    EXPECT_FALSE(auto_candidate(Algorithm::two_level, in));
    in.hosts = 4;
    in.ranks_per_host = 1;
    EXPECT_EQ(predict(in)[two], kNotApplicable) << spec << ": one rank a host";
    in.hosts = 2;
    in.ranks_per_host = 2;
    EXPECT_TRUE(auto_candidate(Algorithm::two_level, in));
    // Inside the host by messages as slow as between hosts: the flat algorithms' (no step saved).
    EXPECT_NE(cheapest(in), Algorithm::two_level) << spec;
    // Through shared memory, or on a fast network inside the host: two_level.
    in.host_memory = true;
    EXPECT_EQ(cheapest(in), Algorithm::two_level) << spec;
    in.host_memory = false;
    in.host_network = network_for_rate(8 * 5e9, 2e-6);
    EXPECT_EQ(cheapest(in), Algorithm::two_level) << spec;
    // Bytes: inside, half the tensor each way; across, one chunk's payload to the other host.
    ModelInput chunk = in;
    chunk.n = in.n / 2;
    chunk.ranks = 2;
    chunk.hosts = 0;
    chunk.sent = in.sent / 2;
    chunk.payload_bytes = in.payload_bytes / 2;
    chunk.average = false;
    const Algorithm family = in.sparse ? Algorithm::sparse_allgather : Algorithm::allgather;
    const double across = predict_bytes(chunk)[static_cast<std::size_t>(family)];
    EXPECT_DOUBLE_EQ(predict_bytes(in)[two], 2 * 0.5 * 4 * in.n + 2 * 8 + across) << spec;
  }
}

}  // namespace
}  // namespace gcomp

namespace gcomp {
namespace {

// fewest_bytes_algorithm: the fewest predict_bytes among the algorithms auto weighs for the codec,
// never dense for a codec that compresses (it would send float32), dense for none, never
// compressed_reduce_scatter for a sparse codec (a second compression of the sum, which auto
// leaves to an explicit choice); the trainer's old rule where the models say the same (allgather
// at two ranks for a dense codec, where it compresses once, compressed_reduce_scatter's
// 2 (P-1)/P payloads from three ranks on; the low-rank codec's only row).
TEST(CostModel, FewestBytesIsTheLeastOfTheRowsThatSendTheCodec) {
  const auto in_for = [](const Codec& codec, std::size_t n, int p) {
    ModelInput in;
    in.n = static_cast<double>(n);
    in.ranks = p;
    in.codec = &codec;
    in.codec_none = codec.kind() == CodecKind::none;
    in.sparse = codec.properties().sparse;
    in.sent = static_cast<double>(in.sparse ? codec.selected(n) : 0);
    in.payload_bytes =
        static_cast<double>(codec.expected_bytes(n, static_cast<std::size_t>(in.sent)));
    in.value_bytes = codec.properties().value_bytes > 0 ? codec.properties().value_bytes : 4;
    return in;
  };
  for (const char* spec : {"none", "fp16", "qsgd:bits=4", "topk:ratio=0.01",
                           "topk:ratio=0.01,chunk=4096,bits=2", "randomk:ratio=0.01", "sign"}) {
    const Codec codec(spec);
    for (int p : {2, 3, 4, 5, 8}) {
      const ModelInput in = in_for(codec, 366432, p);
      const Algorithm a = fewest_bytes_algorithm(in);
      const auto bytes = predict_bytes(in);
      EXPECT_EQ(a == Algorithm::dense, codec.kind() == CodecKind::none) << spec << " P " << p;
      EXPECT_TRUE(auto_candidate(a, in)) << spec << " P " << p;
      if (codec.properties().sparse) EXPECT_NE(a, Algorithm::compressed_reduce_scatter) << spec;
      for (int b = 1; b < kAlgorithmCount; ++b) {
        if (!auto_candidate(static_cast<Algorithm>(b), in)) continue;
        if (b == static_cast<int>(Algorithm::dense) && codec.kind() != CodecKind::none) continue;
        EXPECT_LE(bytes[static_cast<int>(a)], bytes[b])
            << spec << " P " << p << ": " << algorithm_name(a) << " against "
            << algorithm_name(static_cast<Algorithm>(b));
      }
    }
  }
  const Codec fp16("fp16");
  EXPECT_EQ(fewest_bytes_algorithm(in_for(fp16, 1 << 20, 2)), Algorithm::allgather);
  EXPECT_EQ(fewest_bytes_algorithm(in_for(fp16, 1 << 20, 4)), Algorithm::compressed_reduce_scatter);
  const Codec lr("powersgd:rank=2");
  EXPECT_EQ(fewest_bytes_algorithm(in_for(lr, 1 << 20, 4)), Algorithm::low_rank);
  EXPECT_EQ(parse_algorithm("fewest_bytes"), Algorithm::fewest_bytes);
  EXPECT_STREQ(algorithm_name(Algorithm::fewest_bytes), "fewest_bytes");
}

}  // namespace
}  // namespace gcomp
