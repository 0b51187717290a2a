// Edge cases, as named tests for every codec: empty, one element, odd sizes, k >= n, all zeros,
// NaN and Inf input, huge values.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>

#include "test_util.hpp"

namespace gcomp {
namespace {

class Edge : public ::testing::TestWithParam<std::string> {
 protected:
  Codec codec{GetParam()};
  std::vector<float> round_trip(const std::vector<float>& x, std::uint64_t seed = 1) {
    const auto p = codec.encode(x, seed);
    EXPECT_EQ(inspect(p).elements, x.size());
    return test::decode(p, x.size());
  }
};

TEST_P(Edge, Empty) {
  const std::vector<float> x;
  const auto p = codec.encode(x, 1);
  EXPECT_EQ(p.size(), codec.max_bytes(0));
  std::vector<float> acc;
  decode_add(p, acc);
  ErrorFeedback ef(0);
  EXPECT_NO_THROW(codec.encode_ef(ef, x, 1));
}

TEST_P(Edge, OneElement) {
  for (float v : {0.75f, -2.5f, 0.0f}) {
    const auto y = round_trip({v});
    ASSERT_EQ(y.size(), 1u);
    EXPECT_TRUE(std::isfinite(y[0]));
    if (codec.kind() == CodecKind::none || codec.kind() == CodecKind::topk ||
        codec.kind() == CodecKind::sign || codec.kind() == CodecKind::qsgd) {
      // One element: top-k keeps it and sign's scale is |v| (both exact); QSGD's norm is |v| and
      // its decode fl(fl(|v| / s) * s) at level s, two roundings of u = 2^-24.
      EXPECT_NEAR(y[0], v, (0x1p-23 + 0x1p-48) * std::fabs(v)) << GetParam();
    }
  }
}

TEST_P(Edge, OddSizes) {
  for (std::size_t n : {3u, 15u, 17u, 1023u, 4097u, 65537u}) {
    const auto x = test::normal(n, static_cast<std::uint32_t>(n));
    const auto y = round_trip(x);
    double err = 0, norm = 0;
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_TRUE(std::isfinite(y[i]));
      err += (y[i] - x[i]) * (y[i] - x[i]);
      norm += x[i] * x[i];
    }
    // Every codec here keeps the error of the order of the input or below (random-k scaled by
    // n/k is the loudest: sqrt(n/k - 1) = 3 for ratio 0.1).
    EXPECT_LE(std::sqrt(err / norm), 3.2) << GetParam() << " n=" << n;
  }
}

TEST_P(Edge, AllZeros) {
  for (std::size_t n : {1u, 16u, 1000u, 70000u}) {
    const std::vector<float> x(n, 0.0f);
    const auto y = round_trip(x);
    for (float v : y) ASSERT_EQ(v, 0.0f) << GetParam();
    ErrorFeedback ef(n);
    const auto p = codec.encode_ef(ef, x, 2);
    for (float v : ef.residual()) ASSERT_EQ(v, 0.0f) << GetParam();
    for (float v : test::decode(p, n)) ASSERT_EQ(v, 0.0f);
  }
}

TEST_P(Edge, NonFiniteInputIsRejectedWithItsIndex) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    for (std::size_t at : {0u, 5u, 40000u}) {
      auto x = test::normal(40001, 4);
      x[at] = bad;
      x[40000 - at / 2] = bad;  // a second one later: the message names the first
      try {
        codec.encode(x, 1);
        ADD_FAILURE() << GetParam() << " accepted " << bad;
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), Status::nonfinite);
        EXPECT_NE(std::string(e.what()).find("element " +
                                             std::to_string(std::min(at, 40000 - at / 2)) + " "),
                  std::string::npos)
            << e.what();
      }
    }
  }
}

TEST_P(Edge, HugeValuesStayFinite) {
  std::vector<float> x = test::normal(4099, 5, 1e37f);
  x[0] = FLT_MAX;
  x[1] = -FLT_MAX;
  x[2] = 3e38f;
  const auto y = round_trip(x);
  for (std::size_t i = 0; i < x.size(); ++i)
    ASSERT_TRUE(std::isfinite(y[i])) << GetParam() << " " << i;
  if (codec.kind() == CodecKind::none) EXPECT_EQ(y, x);
  std::vector<float> acc(x.size(), 0.0f);
  decode_add(codec.encode(x, 1), acc, 0.5f);
  for (float v : acc) ASSERT_TRUE(std::isfinite(v));
  // Tiny values too: nothing becomes NaN or flushes a whole bucket by underflow.
  const std::vector<float> tiny = test::normal(1000, 6, 1e-38f);
  for (float v : round_trip(tiny)) ASSERT_TRUE(std::isfinite(v));
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, Edge, ::testing::ValuesIn(test::all_specs()),
                         [](const auto& info) { return test::name_of(info.param); });

TEST(EdgeSparse, KAtLeastN) {
  for (const char* spec : {"topk:k=1000", "randomk:k=1000", "topk:ratio=1", "randomk:ratio=1"}) {
    const Codec all(spec);
    for (std::size_t n : {1u, 5u, 7u, 999u, 1000u}) {
      const auto x = test::normal(n, 3);
      EXPECT_EQ(all.selected(n), n) << spec;
      EXPECT_EQ(test::decode(all.encode(x, 1), n), x) << spec;
    }
  }
}

TEST(EdgeTiny, QsgdKeepsSubnormalBuckets) {
  // A bucket whose norm is below FLT_MIN still quantizes (the divide form), rather than zeroing.
  std::vector<float> x(512, 0.0f);
  x[3] = 1e-40f;
  x[4] = -2e-40f;
  const auto y = test::decode(Codec("qsgd:bits=8").encode(x, 1), x.size());
  EXPECT_NE(y[4], 0.0f);
  EXPECT_LT(y[4], 0.0f);
}

}  // namespace
}  // namespace gcomp
