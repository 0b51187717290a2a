// The cost model's formulas (collectives/cost_model.cpp, docs/algorithms.md) on synthetic inputs,
// where the expected seconds can be written down. No MPI: every rank runs the same checks.
#include "gcomp/cost_model.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace gcomp {
namespace {

double union_of(double n, double k, double m) { return n * (1 - std::pow(1 - k / n, m)); }

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
  const double want = (8 + in.sent * 8) * 8e-9 +
                      (8 + union_of(in.n, in.sent, 2) * 8) * two_flows +
                      (8 + union_of(in.n, in.sent, 3) * 8) * 8e-9;
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
