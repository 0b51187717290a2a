// The streams the sparse collectives exchange (collectives/stream.hpp, docs/wire-format.md
// "Streams"): the round trip with float32 and binary16 values, the fallback to float32 where a
// value is beyond binary16, and the receiver's checks. No MPI: every rank runs the same checks.
#include "sparse_vector.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "gcomp/error.hpp"
#include "half.hpp"

namespace gcomp::detail {
namespace {

SparseVector sparse_stream(std::uint64_t n, std::size_t count, std::uint32_t seed, float scale = 1) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  SparseVector s;
  s.n = n;
  for (std::uint64_t i = 0; i < n && s.idx.size() < count; i += 1 + g() % 50) {
    s.idx.push_back(i);
    s.val.push_back(d(g));
  }
  return s;
}

SparseVector dense_stream(std::uint64_t n, std::uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 3.0f);
  SparseVector s;
  s.n = n;
  s.full = true;
  for (std::uint64_t i = 0; i < n; ++i) s.val.push_back(d(g));
  return s;
}

std::uint64_t head_of(const std::vector<std::byte>& b) {
  std::uint64_t h;
  std::memcpy(&h, b.data(), 8);
  return h;
}

float rounded(float v) { return half_to_float(float_to_half(v)); }

TEST(SparseVector, RoundTripsWithFloat32AndBinary16Values) {
  for (bool dense : {false, true}) {
    const SparseVector s = dense ? dense_stream(1000, 1) : sparse_stream(100000, 3000, 2);
    std::vector<std::byte> f32, f16;
    EXPECT_FALSE(serialize(s, f32, false));
    EXPECT_TRUE(serialize(s, f16, true));
    // Two bytes fewer per value, the same head apart from bit 62, the same packed indices.
    EXPECT_EQ(f32.size() - f16.size(), 2 * s.val.size());
    EXPECT_EQ(head_of(f32) | (std::uint64_t{1} << 62), head_of(f16));
    SparseVector a, b;
    deserialize(f32, s.n, a);
    deserialize(f16, s.n, b);
    EXPECT_EQ(a.full, dense);
    EXPECT_EQ(b.full, dense);
    EXPECT_EQ(a.idx, s.idx);
    EXPECT_EQ(b.idx, s.idx);
    EXPECT_EQ(a.val, s.val);
    ASSERT_EQ(b.val.size(), s.val.size());
    std::size_t bad = 0;
    for (std::size_t j = 0; j < s.val.size(); ++j) bad += b.val[j] != rounded(s.val[j]);
    EXPECT_EQ(bad, 0u);
    // round_to_half gives what the receiver reads, and then sends exactly that.
    SparseVector c = s;
    EXPECT_TRUE(round_to_half(c));
    EXPECT_EQ(c.val, b.val);
    std::vector<std::byte> again;
    serialize(c, again, true);
    EXPECT_EQ(again, f16);
  }
}

// A value beyond binary16's range (or not finite) keeps the whole stream in float32: nothing
// saturates.
TEST(SparseVector, Binary16FallsBackToFloat32BeyondItsRange) {
  for (float big : {65505.0f, -1e6f, INFINITY, NAN}) {
    SparseVector s = sparse_stream(5000, 100, 3);
    s.val[7] = big;
    std::vector<std::byte> out;
    EXPECT_FALSE(serialize(s, out, true)) << big;
    EXPECT_EQ(head_of(out) >> 62 & 1, 0u);
    SparseVector copy = s;
    EXPECT_FALSE(round_to_half(copy));
    EXPECT_EQ(std::memcmp(copy.val.data(), s.val.data(), 4 * s.val.size()), 0);
    SparseVector back;
    deserialize(out, s.n, back);
    EXPECT_EQ(std::memcmp(back.val.data(), s.val.data(), 4 * s.val.size()), 0);
  }
  // 65504, the largest half, still goes as binary16.
  SparseVector s = sparse_stream(5000, 100, 4);
  s.val[3] = -65504.0f;
  std::vector<std::byte> out;
  EXPECT_TRUE(serialize(s, out, true));
}

void expect_rejected(const std::vector<std::byte>& bytes, std::uint64_t n, const char* what) {
  SparseVector s;
  try {
    deserialize(bytes, n, s);
    ADD_FAILURE() << what << ": accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Status::bad_payload) << what;
  }
}

TEST(SparseVector, ReceiverRejectsMalformedStreams) {
  const SparseVector s = sparse_stream(10000, 200, 5);
  std::vector<std::byte> good;
  serialize(s, good, true);
  SparseVector ok;
  deserialize(good, s.n, ok);  // accepted as it is

  expect_rejected(std::vector<std::byte>(good.begin(), good.begin() + 7), s.n, "short head");
  // Fewer value bytes than the count needs.
  expect_rejected(std::vector<std::byte>(good.begin(), good.begin() + 8 + 2 * 199), s.n,
                  "short values");
  // A count above n.
  auto more = good;
  const std::uint64_t big = (std::uint64_t{1} << 62) | 20000;
  std::memcpy(more.data(), &big, 8);
  expect_rejected(more, s.n, "count above n");
  // A binary16 infinity or NaN among the values.
  for (std::uint16_t h : {std::uint16_t{0x7c00}, std::uint16_t{0xfe00}}) {
    auto bad = good;
    std::memcpy(bad.data() + 8 + 2 * 5, &h, 2);
    expect_rejected(bad, s.n, "non-finite half");
  }
  // An index at or beyond n: the same bytes read against a smaller range.
  expect_rejected(good, s.idx.back(), "index beyond n");
  // Dense streams: exactly n values of the head's width.
  const SparseVector d = dense_stream(300, 6);
  std::vector<std::byte> f16, f32;
  serialize(d, f16, true);
  serialize(d, f32, false);
  SparseVector back;
  deserialize(f16, 300, back);
  deserialize(f32, 300, back);
  expect_rejected(f16, 299, "dense count is not n");
  auto longer = f16;
  longer.push_back(std::byte{0});
  expect_rejected(longer, 300, "dense binary16 with a byte more");
  expect_rejected(std::vector<std::byte>(f32.begin(), f32.end() - 2), 300, "dense float32 short");
}

// merge_into against a map of index -> acc's value + other's value (in that order, the order the
// partner's merge sums in): indices strictly ascending, the sums' bits, the switch to full by the
// byte rule, and a warm accumulator that keeps its buffers (it allocates nothing, so what the
// workspace holds does not depend on the sizes of the last merge).
TEST(SparseVector, MergeSumsEveryIndexOnceInOrderAndKeepsItsBuffers) {
  constexpr std::uint64_t n = 100000;
  std::mt19937 g(7);
  std::normal_distribution<float> d(0.0f, 1.0f);
  // `count` distinct indices below n, ascending, with normal values.
  const auto subset = [&](std::size_t count) {
    std::vector<std::uint64_t> all(n);
    for (std::uint64_t i = 0; i < n; ++i) all[i] = i;
    std::shuffle(all.begin(), all.end(), g);
    SparseVector s;
    s.n = n;
    s.idx.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(count));
    std::sort(s.idx.begin(), s.idx.end());
    for (std::size_t j = 0; j < count; ++j) s.val.push_back(d(g));
    return s;
  };
  for (int round = 0; round < 40; ++round) {
    // Counts from none to past the full switch (at 50000 entries: 8 bytes each against 4 * n).
    const std::size_t ca = (round * 997u) % 40000, cb = (round * 1499u + 13) % 40000;
    const SparseVector a = subset(ca);
    SparseVector b2 = subset(cb);
    // Every third round, b holds half of a's indices and none of its own (only sums).
    if (round % 3 == 0) {
      b2.idx.assign(a.idx.begin(), a.idx.begin() + static_cast<std::ptrdiff_t>(a.idx.size() / 2));
      b2.val.assign(b2.idx.size(), 0.25f);
    }
    std::map<std::uint64_t, float> want;
    for (std::size_t j = 0; j < a.idx.size(); ++j) want[a.idx[j]] = a.val[j];
    for (std::size_t j = 0; j < b2.idx.size(); ++j) {
      auto it = want.find(b2.idx[j]);
      if (it == want.end()) {
        want[b2.idx[j]] = b2.val[j];
      } else {
        it->second = it->second + b2.val[j];
      }
    }
    SparseVector acc = a;
    acc.idx.reserve(a.idx.size() + b2.idx.size());
    acc.val.reserve(a.idx.size() + b2.idx.size());
    const std::uint64_t* idx_before = acc.idx.data();
    const float* val_before = acc.val.data();
    const bool goes = goes_full(a.idx.size() + b2.idx.size(), n);
    merge_into(acc, b2);
    ASSERT_EQ(acc.full, goes) << "round " << round;
    if (acc.full) {
      ASSERT_EQ(acc.val.size(), n);
      for (std::uint64_t i = 0; i < n; ++i) {
        const auto it = want.find(i);
        const float w = it == want.end() ? 0.0f : it->second;
        ASSERT_EQ(std::memcmp(&acc.val[i], &w, 4), 0) << "round " << round << " index " << i;
      }
      continue;
    }
    EXPECT_EQ(acc.idx.data(), idx_before) << "round " << round << ": the indices reallocated";
    EXPECT_EQ(acc.val.data(), val_before) << "round " << round << ": the values reallocated";
    ASSERT_EQ(acc.idx.size(), want.size()) << "round " << round;
    ASSERT_EQ(acc.val.size(), want.size()) << "round " << round;
    std::size_t j = 0;
    for (const auto& [i, v] : want) {
      ASSERT_EQ(acc.idx[j], i) << "round " << round << " entry " << j;
      ASSERT_EQ(std::memcmp(&acc.val[j], &v, 4), 0) << "round " << round << " entry " << j;
      ++j;
    }
  }
}

}  // namespace
}  // namespace gcomp::detail
