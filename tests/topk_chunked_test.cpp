// Top-k per chunk (topk:...,chunk=C[,bits=B]) against its definition in docs/wire-format.md,
// written again here from the text: each chunk keeps its k largest |v| (ties to the lower
// index); codes take level l = min(floor(f32(a / m) L), L - 1) from the chunk's largest kept
// |v| m and decode to S (2l + 1) / 2^B with S the least-squares scale. Also the sizes: the
// smaller index format, and what an entry costs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "bytes.hpp"
#include "index_pack.hpp"
#include "test_util.hpp"
#include "wire.hpp"

namespace gcomp {
namespace {

// A ratio as a spec writes it (0.01, 0.3, 1).
std::string format(double r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", r);
  return buf;
}

struct Spec {
  double ratio;        // > 0: round(ratio len), at least 1
  std::uint64_t k;     // else min(k, len)
  std::uint64_t chunk;
  int bits;            // 0: float32 values
  std::string text() const {
    std::string s = "topk:";
    s += ratio > 0 ? "ratio=" + format(ratio) : "k=" + std::to_string(k);
    s += ",chunk=" + std::to_string(chunk);
    if (bits) s += ",bits=" + std::to_string(bits);
    return s;
  }
  std::uint64_t entries(std::uint64_t len) const {
    if (ratio > 0) {
      const double r = std::round(ratio * static_cast<double>(len));
      return std::min<std::uint64_t>(len, r < 1 ? 1 : static_cast<std::uint64_t>(r));
    }
    return std::min(k, len);
  }
};

// The decode the definition gives for v, and the kept indices.
std::vector<float> reference(const Spec& s, const std::vector<float>& v,
                             std::vector<std::uint64_t>* kept = nullptr) {
  std::vector<float> out(v.size(), 0.0f);
  for (std::size_t b = 0; b < v.size(); b += s.chunk) {
    const std::size_t len = std::min<std::size_t>(s.chunk, v.size() - b);
    std::vector<std::size_t> order(len);
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](std::size_t i, std::size_t j) {
      return std::fabs(v[b + i]) > std::fabs(v[b + j]);
    });
    order.resize(s.entries(len));
    std::sort(order.begin(), order.end());
    if (kept) {
      for (std::size_t i : order) kept->push_back(b + i);
    }
    if (s.bits == 0) {
      for (std::size_t i : order) out[b + i] = v[b + i];
      continue;
    }
    const std::uint32_t levels = 1u << (s.bits - 1);
    float m = 0;
    for (std::size_t i : order) m = std::max(m, std::fabs(v[b + i]));
    std::vector<std::uint32_t> level(order.size(), 0);
    double num = 0, den = 0;
    for (std::size_t j = 0; j < order.size(); ++j) {
      const float a = std::fabs(v[b + order[j]]);
      if (m > 0) {
        const float r = a / m;
        level[j] = std::min(static_cast<std::uint32_t>(std::floor(r * static_cast<float>(levels))),
                            levels - 1);
      }
      const double q = (2.0 * level[j] + 1) / std::ldexp(1.0, s.bits);
      num += static_cast<double>(a) * q;
      den += q * q;
    }
    const double ls = num / den;
    const float scale = ls > FLT_MAX ? FLT_MAX : static_cast<float>(ls);
    for (std::size_t j = 0; j < order.size(); ++j) {
      const float q = static_cast<float>((2.0 * level[j] + 1) / std::ldexp(1.0, s.bits));
      const float d = scale * q;
      out[b + order[j]] = v[b + order[j]] < 0 ? -d : d;
    }
  }
  return out;
}

const std::vector<Spec> kSpecs = {{0.01, 0, 4096, 2}, {0.01, 0, 4096, 0}, {0, 3, 100, 3},
                                  {0, 2, 7, 8},       {0.05, 0, 64, 1},   {0.3, 0, 10, 4},
                                  {1.0, 0, 16, 2},    {0, 1, 1, 2}};

// Sizes around the chunks: empty, one element, a chunk and one, several and a short last.
const std::vector<std::size_t> kSizes = {0, 1, 7, 17, 101, 4097, 10000};

TEST(TopkChunked, DecodesAsTheDefinitionSays) {
  for (const Spec& s : kSpecs) {
    const Codec c(s.text());
    EXPECT_EQ(c.kind(), CodecKind::topk_chunked) << s.text();
    for (std::size_t n : kSizes) {
      const std::vector<float> x = test::normal(n, static_cast<std::uint32_t>(n + 3));
      std::vector<std::uint64_t> kept;
      const std::vector<float> want = reference(s, x, &kept);
      const std::vector<std::byte> p = c.encode(x, 1);
      ASSERT_EQ(test::decode(p, n), want) << s.text() << " n " << n;
      EXPECT_EQ(c.selected(n), kept.size()) << s.text() << " n " << n;
      SparseEntries e;
      sparse_entries(p, e);
      EXPECT_EQ(e.indices, kept) << s.text() << " n " << n;
    }
  }
}

// Equal magnitudes: the lower indices are kept, in every chunk.
TEST(TopkChunked, TiesGoToTheLowerIndex) {
  std::vector<float> x(300);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = (i % 3 == 0 ? -1.0f : 1.0f) * (i % 50 < 45);
  for (const Spec& s : {Spec{0, 4, 100, 0}, Spec{0, 4, 100, 2}, Spec{0.1, 0, 64, 3}}) {
    std::vector<std::uint64_t> kept;
    const std::vector<float> want = reference(s, x, &kept);
    EXPECT_EQ(test::decode(Codec(s.text()).encode(x, 1), x.size()), want) << s.text();
    EXPECT_EQ(kept.front(), 0u);
  }
}

// With error feedback the residual is v - decode, bit for bit, and x + e_old is what is coded.
TEST(TopkChunked, ErrorFeedbackKeepsWhatWasNotSent) {
  for (const Spec& s : kSpecs) {
    const Codec c(s.text());
    const std::size_t n = 4097;
    ErrorFeedback ef(n);
    std::vector<float> e_old(n, 0.0f);
    for (int step = 0; step < 3; ++step) {
      const std::vector<float> x = test::normal(n, 20 + step);
      std::vector<float> v(n);
      for (std::size_t i = 0; i < n; ++i) v[i] = x[i] + e_old[i];
      const std::vector<float> d = test::decode(c.encode_ef(ef, x, 1), n);
      ASSERT_EQ(d, reference(s, v)) << s.text() << " step " << step;
      const auto e = ef.residual();
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(e[i], v[i] - d[i]) << s.text() << " " << i;
      e_old.assign(e.begin(), e.end());
    }
  }
}

// The codes' error in a chunk is at most that of the grid the levels come from (the bins' middles
// m (2l + 1) / 2L, each |a| within m / 2L of its own), since the least-squares scale does no
// worse than the grid's: sum over the kept (|v| - decode)^2 <= kept (m / 2L)^2, well below the
// kept |v|^2 (whatever B, the decode is a contraction of the kept values: strictly less).
TEST(TopkChunked, CodesCostAtMostTheirGridsError) {
  for (int bits = 1; bits <= 8; ++bits) {
    const Spec s{0.05, 0, 256, bits};
    const std::vector<float> x = test::normal(4096, 9);
    std::vector<std::uint64_t> kept;
    reference(s, x, &kept);
    const std::vector<float> d = test::decode(Codec(s.text()).encode(x, 1), x.size());
    const double L = std::ldexp(1.0, bits - 1);
    for (std::size_t b = 0; b < x.size(); b += s.chunk) {
      double err = 0, energy = 0, m = 0;
      int count = 0;
      for (std::uint64_t i : kept) {
        if (i < b || i >= b + s.chunk) continue;
        m = std::max(m, static_cast<double>(std::fabs(x[i])));
        err += (static_cast<double>(x[i]) - d[i]) * (static_cast<double>(x[i]) - d[i]);
        energy += static_cast<double>(x[i]) * x[i];
        ++count;
      }
      // 2^-20: the scale's and the decode's float32 roundings, relative to the kept energy.
      EXPECT_LE(err, count * (m / (2 * L)) * (m / (2 * L)) + 0x1p-20 * energy)
          << "bits " << bits << " chunk at " << b;
      EXPECT_LT(err, energy);
    }
  }
}

// The encoder writes the smaller of the two index formats: chunk-relative indices of
// bit_width(C - 1) bits (rare keeps in small chunks), or the gaps packed (sparse keeps in large
// chunks). Both decode.
TEST(TopkChunked, TheSmallerIndexFormatIsWritten) {
  struct Case {
    const char* spec;
    std::size_t n;
    const char* index;
    std::size_t width;  // bit_width(C - 1)
  };
  for (const Case& k : {Case{"topk:k=1,chunk=8,bits=2", 8000, "index=relative", 3},
                        Case{"topk:ratio=0.01,chunk=4096,bits=2", 1 << 16, "index=packed", 12}}) {
    const Codec c(k.spec);
    const std::vector<float> x = test::normal(k.n, 5);
    const std::vector<std::byte> p = c.encode(x, 1);
    const PayloadInfo info = inspect(p);
    EXPECT_NE(info.params.find(k.index), std::string::npos) << info.params;
    SparseEntries e;
    sparse_entries(p, e);
    const std::size_t fixed = (e.indices.size() * k.width + 7) / 8;
    const std::size_t packed = detail::packed_indices_size(e.indices.data(), e.indices.size());
    EXPECT_EQ(info.sections[0], std::min(fixed, packed)) << k.spec;
  }
}

// topk:ratio=0.01,chunk=4096,bits=2 spends at most bit_width(4095) = 12 index bits, 2 code bits
// and its chunk's scale (32 / 41 bits) an entry: under 14.8 bits, where top-k with float32 values
// spends 32 and its packed gaps of about 100, at least 7 bits (bit_width(100)): 2.6 times as much.
TEST(TopkChunked, AnEntryCostsUnderSixteenBits) {
  const std::size_t n = std::size_t{1} << 20;
  const std::vector<float> x = test::normal(n, 11);
  const Codec c("topk:ratio=0.01,chunk=4096,bits=2");
  const std::vector<std::byte> p = c.encode(x, 1);
  const double entries = static_cast<double>(c.selected(n));
  const double bits = 8.0 * static_cast<double>(p.size() - detail::kMaxHeaderBytes) / entries;
  EXPECT_LE(bits, 12 + 2 + 32.0 / 41);
  const std::vector<std::byte> plain = Codec("topk:ratio=0.01").encode(x, 1);
  EXPECT_LT(static_cast<double>(p.size()) * 2.5, static_cast<double>(plain.size()));
}

TEST(TopkChunked, SpecsAndCounts) {
  EXPECT_EQ(Codec("topk:ratio=0.01,chunk=4096,bits=2").spec(), "topk:ratio=0.01,chunk=4096,bits=2");
  EXPECT_EQ(Codec("topk:chunk=4096,ratio=0.01").spec(), "topk:ratio=0.01,chunk=4096,values=fp32");
  EXPECT_EQ(Codec("topk:k=5,chunk=100,values=fp16").spec(), "topk:k=5,chunk=100,values=fp16");
  EXPECT_EQ(Codec("topk:ratio=0.01").kind(), CodecKind::topk);
  EXPECT_STREQ(codec_name(CodecKind::topk_chunked), "topk_chunked");
  const Codec c("topk:ratio=0.01,chunk=4096,bits=2");
  EXPECT_EQ(c.selected(0), 0u);
  EXPECT_EQ(c.selected(1), 1u);
  EXPECT_EQ(c.selected(4096), 41u);
  EXPECT_EQ(c.selected(10000), 41u + 41u + 18u);  // the last chunk's 1808 elements keep 18
  const Codec k("topk:k=5,chunk=100,bits=1");
  EXPECT_EQ(k.selected(250), 15u);
  EXPECT_EQ(k.selected(103), 8u);  // 5 and the last chunk's 3 (all of it)
  const CodecProperties p = c.properties();
  EXPECT_TRUE(p.sparse);
  EXPECT_TRUE(p.contraction);
  EXPECT_TRUE(p.sends_late);
  EXPECT_FALSE(p.split_per_tensor);
  EXPECT_EQ(p.value_bytes, 0);
  EXPECT_EQ(Codec("topk:ratio=0.01,chunk=64,values=fp16").properties().value_bytes, 2);
  // max_bytes bounds every payload; expected_bytes is near what a normal tensor takes.
  const std::vector<float> x = test::normal(100000, 2);
  const std::size_t got = c.encode(x, 1).size();
  EXPECT_LE(got, c.max_bytes(x.size()));
  EXPECT_NEAR(static_cast<double>(c.expected_bytes(x.size(), c.selected(x.size()))),
              static_cast<double>(got), 0.05 * static_cast<double>(got));
}

// Large values saturate the scale at FLT_MAX instead of overflowing; the decode stays finite.
TEST(TopkChunked, HugeValuesSaturateTheScale) {
  std::vector<float> x(64, FLT_MAX);
  x[3] = -FLT_MAX;
  const Codec c("topk:k=64,chunk=64,bits=2");
  const std::vector<float> d = test::decode(c.encode(x, 1), x.size());
  for (float v : d) EXPECT_TRUE(std::isfinite(v));
  EXPECT_EQ(d, reference(Spec{0, 64, 64, 2}, x));
}

}  // namespace
}  // namespace gcomp
