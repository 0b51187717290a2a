// The Philox stream: Random123's known-answer vectors, the SIMD batch generator against the
// Random123 reference, and the stream layout the CPU and CUDA codecs share.
#include "philox.hpp"

#include <Random123/philox.h>
#include <gtest/gtest.h>

#include <vector>

#include "simd.hpp"

namespace gcomp::detail {
namespace {

TEST(Philox, Random123KnownAnswers) {
  // From Random123's kat_vectors for philox4x32-10.
  r123::Philox4x32 rng;
  auto r = rng({{0, 0, 0, 0}}, {{0, 0}});
  EXPECT_EQ(r[0], 0x6627e8d5u);
  EXPECT_EQ(r[3], 0x9b00dbd8u);
  r = rng({{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}}, {{0xa4093822, 0x299f31d0}});
  EXPECT_EQ(r[0], 0xd16cfe09u);
  EXPECT_EQ(r[1], 0x94fdccebu);
  EXPECT_EQ(r[2], 0x5001e420u);
  EXPECT_EQ(r[3], 0x24126ea1u);
}

// At every SIMD level the machine can run (simd.hpp).
TEST(Philox, BatchMatchesReference) {
  set_simd_level(SimdLevel::avx512);
  const SimdLevel best = simd_level();
  for (SimdLevel level : {SimdLevel::baseline, SimdLevel::avx2, SimdLevel::avx512}) {
    if (level > best) break;
    set_simd_level(level);
    for (std::uint64_t seed : {0ull, 1ull, 0xdeadbeefcafef00dull}) {
      const PhiloxStream s = philox_stream(seed, CodecKind::qsgd);
      for (std::uint64_t first : {0ull, 32ull, 4096ull, (1ull << 35) + 96}) {
        for (std::size_t count : {32u, 64u, 96u, 128u, 160u, 1024u}) {
          std::vector<std::uint32_t> a(count), b(count);
          philox_fill(s, first, count, a.data());
          philox_fill_reference(s, first, count, b.data());
          ASSERT_EQ(a, b) << "seed " << seed << " first " << first << " count " << count
                          << " level " << simd_level_name(level);
          for (std::size_t i = 0; i < count; i += 37) ASSERT_EQ(a[i], philox_word(s, first + i));
        }
      }
    }
  }
  set_simd_level(SimdLevel::avx512);
}

TEST(Philox, StreamLayout) {
  // S[32g + 8w + j] = word w of block 8g + j, block b keyed as the header says.
  const std::uint64_t seed = 0x0123456789abcdefull;
  const PhiloxStream s = philox_stream(seed, CodecKind::terngrad);
  r123::Philox4x32 rng;
  const std::uint64_t block = 8 * 5 + 3;  // g = 5, j = 3
  const auto r = rng(
      {{static_cast<std::uint32_t>(block), 0, static_cast<std::uint32_t>(CodecKind::terngrad), 0}},
      {{0x89abcdefu, 0x01234567u}});
  for (std::uint32_t w = 0; w < 4; ++w) EXPECT_EQ(philox_word(s, 32 * 5 + 8 * w + 3), r[w]);
  // 16-bit draws: the low half first.
  EXPECT_EQ(philox_half(s, 2 * (32 * 5 + 3)), r[0] & 0xffffu);
  EXPECT_EQ(philox_half(s, 2 * (32 * 5 + 3) + 1), r[0] >> 16);
}

TEST(Philox, CodecsAndSeedsGiveDifferentStreams) {
  const auto a = philox_word(philox_stream(7, CodecKind::qsgd), 100);
  EXPECT_NE(a, philox_word(philox_stream(7, CodecKind::terngrad), 100));
  EXPECT_NE(a, philox_word(philox_stream(8, CodecKind::qsgd), 100));
  EXPECT_NE(a, philox_word(philox_stream(7ull | (1ull << 40), CodecKind::qsgd), 100));
}

TEST(Philox, DeriveSeedMixesEveryInput) {
  const std::uint64_t base = derive_seed(1, 2, 3, 4);
  EXPECT_EQ(base, derive_seed(1, 2, 3, 4));
  EXPECT_NE(base, derive_seed(2, 2, 3, 4));
  EXPECT_NE(base, derive_seed(1, 3, 3, 4));
  EXPECT_NE(base, derive_seed(1, 2, 4, 4));
  EXPECT_NE(base, derive_seed(1, 2, 3, 5));
  EXPECT_NE(derive_seed(1, 1ull << 33, 0, 0), derive_seed(1, 0, 0, 0));
  EXPECT_NE(derive_seed(1, 0, 0, 1ull << 40), derive_seed(1, 0, 0, 0));
}

// A training loop's seed per (seed, step, index), gcomp.torch's through the Python module: the
// documented sum, wrapping mod 2^64 (step 2^64 - 1 wraps its step + 1 to 0).
TEST(Philox, StepSeedIsTheDocumentedSum) {
  static_assert(step_seed(0, 0, 0) == 0xbf58476d1ce4e5b9ull);
  EXPECT_EQ(step_seed(1, 2, 3), 0x9ab12d320f8c6301ull);
  EXPECT_EQ(step_seed(5, 0, 0), 0xd66da80c99595222ull);
  EXPECT_EQ(step_seed(~0ull, ~0ull, 1), 0xf698d00193e695d6ull);
  EXPECT_NE(step_seed(7, 1, 0), step_seed(7, 0, 1));
}

}  // namespace
}  // namespace gcomp::detail
