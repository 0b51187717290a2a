// Little-endian loads and stores at any alignment: the wire format is little-endian and payload
// sections need not be aligned, so every access to payload bytes goes through these.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace gcomp::detail {

static_assert(std::endian::native == std::endian::little,
              "gcomp's wire format is little-endian and this build assumes a little-endian host");

template <class T>
inline T load_le(const std::byte* p) noexcept {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <class T>
inline void store_le(std::byte* p, T v) noexcept {
  std::memcpy(p, &v, sizeof(T));
}

inline std::uint32_t float_bits(float f) noexcept { return std::bit_cast<std::uint32_t>(f); }
inline float bits_float(std::uint32_t u) noexcept { return std::bit_cast<float>(u); }

// |x| as the integer bits of the float; monotone in |x| for finite values, and every NaN or Inf
// compares above every finite value.
inline std::uint32_t abs_bits(float f) noexcept { return float_bits(f) & 0x7fffffffu; }
inline constexpr std::uint32_t kInfBits = 0x7f800000u;

}  // namespace gcomp::detail
