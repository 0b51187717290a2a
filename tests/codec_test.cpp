// Per-codec behaviour: fp16/bf16 rounding, the sign scale, QSGD and TernGrad values, payload
// sizes, determinism, and that SIMD kernels and thread counts never change the bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "bytes.hpp"
#include "half.hpp"
#include "simd.hpp"
#include "test_util.hpp"

namespace gcomp {
namespace {

using detail::bits_float;
using detail::float_bits;

// The 16-bit values of an fp16/bf16 payload.
std::vector<std::uint16_t> halves(const std::string& spec, const std::vector<float>& x) {
  const auto p = Codec(spec).encode(x, 0);
  const PayloadInfo info = inspect(p);
  std::vector<std::uint16_t> h(x.size());
  std::memcpy(h.data(), p.data() + info.header_bytes, 2 * x.size());
  return h;
}

TEST(Fp16, EveryFiniteHalfRoundTrips) {
  std::vector<float> x;
  std::vector<std::uint16_t> want;
  for (std::uint32_t h = 0; h < 65536; ++h) {
    if ((h & 0x7c00u) == 0x7c00u) continue;  // Inf/NaN
    x.push_back(detail::half_to_float(static_cast<std::uint16_t>(h)));
    want.push_back(static_cast<std::uint16_t>(h));
  }
  EXPECT_EQ(halves("fp16", x), want);
}

TEST(Fp16, MidpointsRoundToEvenAndNeighboursToNearest) {
  std::vector<float> x;
  std::vector<std::uint16_t> want;
  for (std::uint32_t h = 0; h < 0x7bff; ++h) {  // positive finite pairs (h, h + 1)
    const double a = detail::half_to_float(static_cast<std::uint16_t>(h));
    const double b = detail::half_to_float(static_cast<std::uint16_t>(h + 1));
    const float mid = static_cast<float>((a + b) / 2);  // exact: 12 significant bits at most
    ASSERT_EQ(static_cast<double>(mid), (a + b) / 2);
    x.push_back(mid);
    want.push_back(static_cast<std::uint16_t>((h & 1) ? h + 1 : h));
    x.push_back(std::nextafter(mid, 0.0f));
    want.push_back(static_cast<std::uint16_t>(h));
    x.push_back(-std::nextafter(mid, 1e9f));
    want.push_back(static_cast<std::uint16_t>(0x8000u | (h + 1)));
  }
  EXPECT_EQ(halves("fp16", x), want);
}

TEST(Fp16, SaturatesInsteadOfInf) {
  const std::vector<float> x = {65504.0f, 65519.0f, 65520.0f,       1e10f,          -1e10f,
                                3.4e38f,  1e-8f,    5.9604645e-08f, 2.9802322e-08f, 8.940697e-08f};
  const std::vector<std::uint16_t> want = {0x7bff, 0x7bff, 0x7bff, 0x7bff, 0xfbff,
                                           0x7bff, 0x0000, 0x0001, 0x0000, 0x0002};
  EXPECT_EQ(halves("fp16", x), want);
}

TEST(Bf16, RoundToNearestEvenAndSaturate) {
  std::vector<float> x;
  std::vector<std::uint16_t> want;
  for (std::uint32_t h = 0; h < 0x7f7f; h += 3) {
    x.push_back(bits_float(h << 16));  // exact
    want.push_back(static_cast<std::uint16_t>(h));
    x.push_back(bits_float((h << 16) | 0x8000u));  // midpoint: to even
    want.push_back(static_cast<std::uint16_t>((h & 1) ? h + 1 : h));
    x.push_back(bits_float((h << 16) | 0x8001u));  // above: up
    want.push_back(static_cast<std::uint16_t>(h + 1));
  }
  x.push_back(3.4028235e38f);
  want.push_back(0x7f7f);
  x.push_back(-3.4028235e38f);
  want.push_back(0xff7f);
  EXPECT_EQ(halves("bf16", x), want);
}

TEST(Sign, ScaleIsMeanAbsAndBitsAreSigns) {
  const auto x = test::normal(100003, 21, 3.0f);
  const auto y = test::decode(Codec("sign").encode(x, 0), x.size());
  double mean_abs = 0;
  for (float v : x) mean_abs += std::fabs(v);
  mean_abs /= static_cast<double>(x.size());
  // The codec's mean is a double sum in another order (each of the two within n 2^-53 of the
  // exact value, relatively), rounded once to float (2^-24).
  const double tol = (0x1p-24 + 2 * static_cast<double>(x.size()) * 0x1p-53) * mean_abs;
  for (std::size_t i = 0; i < x.size(); ++i) {
    ASSERT_NEAR(y[i], (x[i] < 0 ? -mean_abs : mean_abs), tol) << i;
  }
}

TEST(Qsgd, LevelsNormsAndBound) {
  for (const char* spec :
       {"qsgd", "qsgd:bits=8", "qsgd:bits=2,bucket=64", "qsgd:bits=3,bucket=100"}) {
    const Codec c(spec);
    const int bits = c.spec()[10] - '0';
    const std::size_t bucket = std::stoul(c.spec().substr(c.spec().find("bucket=") + 7));
    const double s = (1 << (bits - 1)) - 1;
    const auto x = test::normal(10007, 22);
    const auto y = test::decode(c.encode(x, 5), x.size());
    for (std::size_t b0 = 0; b0 < x.size(); b0 += bucket) {
      const std::size_t b1 = std::min(x.size(), b0 + bucket);
      double ss = 0;
      for (std::size_t i = b0; i < b1; ++i) ss += static_cast<double>(x[i]) * x[i];
      const double step = std::sqrt(ss) / s;
      for (std::size_t i = b0; i < b1; ++i) {
        // Each value is a whole number of steps away from zero, with x's sign, within one step.
        // A decode is fl(fl(fl(norm) / s) * level): three roundings of u = 2^-24 (the norm's
        // double sum in another order adds D 2^-53, far less), so q is within 4 u s of its level.
        // The level itself comes from r = fl(|x| * fl(s / norm)) (two more roundings of r <= s),
        // so |y - x| <= step (1 + 5 u s).
        const double u = 0x1p-24;
        const double q = y[i] / step;
        ASSERT_NEAR(q, std::round(q), 4 * u * s) << spec << " i=" << i;
        ASSERT_LE(std::fabs(q), s * (1 + 4 * u));
        ASSERT_LE(std::fabs(y[i] - x[i]), step * (1 + 5 * u * s)) << spec << " i=" << i;
        if (y[i] != 0) ASSERT_EQ(y[i] < 0, x[i] < 0);
      }
    }
  }
}

TEST(TernGrad, ValuesAreMinusZeroPlusScaler) {
  const auto x = test::normal(50001, 23);
  float max_abs = 0;
  double sum = 0, sum2 = 0;
  for (float v : x) {
    max_abs = std::max(max_abs, std::fabs(v));
    sum += v;
    sum2 += static_cast<double>(v) * v;
  }
  const double mean = sum / static_cast<double>(x.size());
  const double sigma = std::sqrt(sum2 / static_cast<double>(x.size()) - mean * mean);
  const float clipped = std::min(max_abs, static_cast<float>(2.5 * sigma));
  for (const auto& [spec, s] :
       {std::pair<std::string, float>{"terngrad:clip=0", max_abs}, {"terngrad", clipped}}) {
    const auto y = test::decode(Codec(spec).encode(x, 3), x.size());
    std::size_t nonzero = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      ASSERT_TRUE(y[i] == 0 || std::fabs(y[i]) == s) << spec << " " << y[i] << " vs " << s;
      if (y[i] != 0) {
        ASSERT_EQ(y[i] < 0, x[i] < 0);
        ++nonzero;
      }
    }
    EXPECT_GT(nonzero, x.size() / 10) << spec;
  }
  EXPECT_LT(clipped, max_abs);  // this input is clipped at 2.5 sigma
}

TEST(PayloadSize, RatiosAgainstFloat32) {
  const std::size_t n = 1 << 20;
  const auto x = test::normal(n, 24);
  const auto ratio = [&](const char* spec) {
    return 4.0 * static_cast<double>(n) / static_cast<double>(Codec(spec).encode(x, 1).size());
  };
  EXPECT_GE(ratio("qsgd:bits=4"), 7.0);
  EXPECT_GE(ratio("sign"), 28.0);
  EXPECT_GE(ratio("terngrad"), 14.0);
  EXPECT_GE(ratio("topk:ratio=0.01"), 40.0);
  EXPECT_GE(ratio("fp16"), 1.99);
  // max_bytes is exact for every dense codec, and an upper bound for the sparse ones (their
  // packed indices take what their gaps need; threshold's count is the data's).
  for (const auto& spec : test::all_specs()) {
    const Codec c(spec);
    for (std::size_t m : {0u, 1u, 17u, 4097u}) {
      const auto p = c.encode(std::span<const float>(x.data(), m), 1);
      if (c.properties().sparse) {
        EXPECT_LE(p.size(), c.max_bytes(m)) << spec;
      } else {
        EXPECT_EQ(p.size(), c.max_bytes(m)) << spec << " n=" << m;
      }
    }
  }
  // Top-k 1% of 1M i.i.d. values: the packed indices take 1.2 bytes an index
  // (index_pack_test.cpp derives it), so an entry 5.2 bytes with float32 values and 3.2 with
  // fp16, against 8 and 6 in version 1; expected_bytes, the cost model's guess, is within 10%.
  {
    const auto big = test::normal(1 << 20, 4);
    const Codec c("topk:ratio=0.01");
    const auto p = c.encode(big, 0);
    const double k = static_cast<double>(c.selected(big.size()));
    EXPECT_NEAR(static_cast<double>(p.size()) / k, 5.2, 0.03);
    const double guess = static_cast<double>(c.expected_bytes(big.size(), c.selected(big.size())));
    EXPECT_NEAR(guess / static_cast<double>(p.size()), 1.0, 0.1);
    const Codec h("topk:ratio=0.01,values=fp16");
    EXPECT_NEAR(static_cast<double>(h.encode(big, 0).size()) / k, 3.2, 0.03);
  }
}

TEST(Determinism, SameSeedSameBytesOtherSeedOtherBytes) {
  const auto x = test::normal(30011, 25);
  for (const auto& spec : test::all_specs()) {
    const Codec c(spec);
    EXPECT_EQ(c.encode(x, 77), c.encode(x, 77)) << spec;
    if (c.spec().ends_with("bucket=1")) {
      // One element per bucket: |x| / norm = 1 exactly, nothing is left to chance.
      EXPECT_EQ(c.encode(x, 77), c.encode(x, 78)) << spec;
    } else if (c.properties().stochastic) {
      EXPECT_NE(c.encode(x, 77), c.encode(x, 78)) << spec;
    } else {
      EXPECT_EQ(c.encode(x, 77), c.encode(x, 78)) << spec;
    }
  }
}

class Restore {
 public:
  ~Restore() {
    set_num_threads(1);
    detail::set_simd_level(detail::SimdLevel::avx512);
  }
};

// Encodes (and error-feedback encodes) x and decodes the result, returning all the bytes.
std::vector<std::byte> fingerprint(const Codec& c, const std::vector<float>& x) {
  auto p = c.encode(x, 9);
  ErrorFeedback ef(x.size());
  for (int step = 0; step < 2; ++step) {
    const auto q = c.encode_ef(ef, x, 10 + step);
    p.insert(p.end(), q.begin(), q.end());
  }
  // Accumulators of -0 show a decode that adds +0 where the scalar reference adds nothing.
  std::vector<float> y(x.size(), 0.5f);
  for (std::size_t i = 0; i < y.size(); i += 3) y[i] = -0.0f;
  decode_add(c.encode(x, 9), y, -0.75f);
  const auto* yb = reinterpret_cast<const std::byte*>(y.data());
  p.insert(p.end(), yb, yb + 4 * y.size());
  const auto* eb = reinterpret_cast<const std::byte*>(ef.residual().data());
  p.insert(p.end(), eb, eb + 4 * x.size());
  return p;
}

// Every SIMD level this machine can run (baseline, AVX2, AVX-512: simd.hpp) writes the same
// payloads, residuals and decodes. Sizes around the vector widths and a large odd one.
TEST(Determinism, EveryKernelLevelGivesTheSameBytes) {
  Restore restore;
  using detail::SimdLevel;
  detail::set_simd_level(SimdLevel::avx512);  // the best this CPU (and GCOMP_SIMD) allows
  const SimdLevel best = detail::simd_level();
  std::vector<SimdLevel> levels = {SimdLevel::baseline};
  if (best >= SimdLevel::avx2) levels.push_back(SimdLevel::avx2);
  if (best >= SimdLevel::avx512) levels.push_back(SimdLevel::avx512);
  std::printf("kernel levels compared on this CPU: %zu (best: %s)\n", levels.size(),
              std::string(detail::simd_level_name(best)).c_str());
  for (std::size_t n : {1u, 15u, 16u, 33u, 1000u, 70001u}) {
    const auto x = test::normal(n, 26);
    for (const auto& spec : test::all_specs()) {
      const Codec c(spec);
      detail::set_simd_level(SimdLevel::baseline);
      ASSERT_EQ(detail::simd_level(), SimdLevel::baseline);
      const auto reference = fingerprint(c, x);
      for (SimdLevel level : levels) {
        detail::set_simd_level(level);
        ASSERT_EQ(detail::simd_level(), level);
        ASSERT_EQ(fingerprint(c, x), reference)
            << spec << " n=" << n << " level " << detail::simd_level_name(level);
      }
    }
  }
}

TEST(Determinism, ThreadCountDoesNotChangeTheBytes) {
  Restore restore;
  const auto x = test::normal((1 << 20) + 4099, 27);
  for (const auto& spec : test::all_specs()) {
    const Codec c(spec);
    set_num_threads(1);
    const auto a = fingerprint(c, x);
    set_num_threads(3);
    const auto b = fingerprint(c, x);
    ASSERT_EQ(a, b) << spec;
  }
}

TEST(Threads, SettingIsValidated) {
  Restore restore;
  EXPECT_THROW(set_num_threads(0), Error);
  set_num_threads(2);
  EXPECT_EQ(num_threads(), 2);
}

}  // namespace
}  // namespace gcomp
