// float32 <-> IEEE fp16 and bfloat16, round to nearest even. Inputs are finite (the codecs reject
// NaN/Inf first); values beyond the 16-bit format's range saturate to its largest finite value
// (65504 for fp16, 0x7f7f for bf16) instead of becoming Inf, so a compressed gradient never turns
// into Inf on the receiving side. These scalar forms are the reference the SIMD paths match.
#pragma once

#include <cstdint>

#include "bytes.hpp"

namespace gcomp::detail {

inline constexpr float kHalfMax = 65504.0f;

inline std::uint16_t float_to_half(float f) noexcept {
  const std::uint32_t x = float_bits(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t a = x & 0x7fffffffu;
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7bffu);  // >= 65520: saturate
  if (a < 0x38800000u) {
    // Below 2^-14 the result is subnormal or zero: adding 0.5 puts the fp16 subnormal grid on the
    // float's last mantissa bit, so the hardware's own round-to-nearest-even does the rounding.
    const float magic = bits_float(126u << 23);  // 0.5f
    const std::uint32_t r = float_bits(bits_float(a) + magic) - (126u << 23);
    return static_cast<std::uint16_t>(sign | r);
  }
  const std::uint32_t odd = (a >> 13) & 1u;
  a += (static_cast<std::uint32_t>(15 - 127) << 23) + 0xfffu + odd;  // rebias and round
  return static_cast<std::uint16_t>(sign | (a >> 13));
}

inline float half_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fu;
  const std::uint32_t m = h & 0x3ffu;
  if (e == 0) {
    const float v = static_cast<float>(m) * bits_float((127u - 24u) << 23);  // m * 2^-24
    return bits_float(float_bits(v) | sign);
  }
  if (e == 31) return bits_float(sign | 0x7f800000u | (m << 13));
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

inline bool half_is_finite(std::uint16_t h) noexcept { return (h & 0x7c00u) != 0x7c00u; }

inline std::uint16_t float_to_bf16(float f) noexcept {
  const std::uint32_t x = float_bits(f);
  const std::uint32_t a = x & 0x7fffffffu;
  if (a >= 0x7f7f8000u) return static_cast<std::uint16_t>(((x >> 16) & 0x8000u) | 0x7f7fu);
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

inline float bf16_to_float(std::uint16_t h) noexcept {
  return bits_float(static_cast<std::uint32_t>(h) << 16);
}

inline bool bf16_is_finite(std::uint16_t h) noexcept { return (h & 0x7f80u) != 0x7f80u; }

}  // namespace gcomp::detail
