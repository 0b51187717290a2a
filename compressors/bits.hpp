// Packed bit streams: element i's B-bit code occupies bits [iB, iB + B) of a section, bit j of the
// stream being bit (j mod 8) of byte j / 8 (least significant first). Used by QSGD, TernGrad and
// sign. BitWriter appends codes; get_bits reads one code anywhere.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gcomp::detail {

class BitWriter {
 public:
  explicit BitWriter(std::byte* out) noexcept : out_(out) {}
  void put(std::uint32_t code, int bits) noexcept {
    acc_ |= static_cast<std::uint64_t>(code) << used_;
    used_ += bits;
    while (used_ >= 8) {
      *out_++ = static_cast<std::byte>(acc_ & 0xffu);
      acc_ >>= 8;
      used_ -= 8;
    }
  }
  // Writes a last partial byte (its high bits zero).
  void finish() noexcept {
    if (used_ > 0) *out_++ = static_cast<std::byte>(acc_ & 0xffu);
    acc_ = 0;
    used_ = 0;
  }

 private:
  std::byte* out_;
  std::uint64_t acc_ = 0;
  int used_ = 0;
};

// The B-bit code of element i (B <= 8).
inline std::uint32_t get_bits(const std::byte* in, std::uint64_t i, int bits) noexcept {
  const std::uint64_t bit = i * static_cast<std::uint64_t>(bits);
  const std::uint64_t byte = bit >> 3;
  const int shift = static_cast<int>(bit & 7);
  std::uint32_t w = static_cast<std::uint32_t>(in[byte]);
  if (shift + bits > 8) w |= static_cast<std::uint32_t>(in[byte + 1]) << 8;
  return (w >> shift) & ((1u << bits) - 1u);
}

// True when the bits of the last byte past `used_bits` are all zero (canonical padding).
inline bool padding_is_zero(const std::byte* section, std::uint64_t bytes,
                            std::uint64_t used_bits) noexcept {
  const int tail = static_cast<int>(used_bits & 7);
  if (tail == 0 || bytes == 0) return true;
  return (static_cast<std::uint32_t>(section[bytes - 1]) >> tail) == 0;
}

}  // namespace gcomp::detail
