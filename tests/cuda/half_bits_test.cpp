// The kernels' integer fp16 conversion (cuda/half_bits.hpp) against the CPU codecs' float_to_half,
// on the host: every float whose magnitude is near one of its boundaries (fp16's subnormals, the
// normal range's start, the saturation at 65520), and a stride through all the others.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "half.hpp"
#include "half_bits.hpp"

namespace {

void expect_same(std::uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  const std::uint32_t want = gcomp::detail::float_to_half(f);
  const std::uint32_t got = gcomp::cuda::detail::half_bits_of(f);
  ASSERT_EQ(got, want) << "float bits " << std::hex << bits;
}

TEST(HalfBits, TheCpusFloatToHalf) {
  for (std::uint32_t sign : {0u, 0x80000000u}) {
    // fp16 subnormals and zero, the start of fp16's normal range, the saturation bound.
    for (std::uint32_t a = 0; a < 0x00100000u; ++a) expect_same(sign | a);
    for (std::uint32_t a = 0x33000000u; a < 0x39000000u; a += 3) expect_same(sign | a);
    for (std::uint32_t a = 0x477f0000u; a < 0x47810000u; ++a) expect_same(sign | a);
    for (std::uint32_t a = 0x7f7f0000u; a <= 0x7f7fffffu; ++a) expect_same(sign | a);  // FLT_MAX
    // Everything finite, a stride apart (odd, so every low-bit pattern comes up).
    for (std::uint64_t a = 0; a < 0x7f800000u; a += 1021) {
      expect_same(sign | static_cast<std::uint32_t>(a));
    }
  }
}

}  // namespace
