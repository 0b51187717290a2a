// Compact sparse indices (index_pack.hpp).
#include "index_pack.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>

#include "gcomp/error.hpp"

namespace gcomp::detail {

namespace {

[[noreturn]] void bad_indices(const std::string& why) {
  throw Error(Status::bad_payload, "bad packed indices: " + why);
}

std::uint64_t block_bytes(std::uint64_t m, unsigned w) { return (m * w + 7) / 8; }

}  // namespace

std::size_t packed_indices_bound(std::uint64_t count, std::uint64_t n) noexcept {
  const unsigned w = n == 0 ? 0 : static_cast<unsigned>(std::bit_width(n - 1));
  const std::uint64_t blocks = (count + kIndexBlock - 1) / kIndexBlock;
  return static_cast<std::size_t>(blocks + block_bytes(count, w) + blocks);  // + rounding
}

std::size_t packed_indices_size(const std::uint64_t* idx, std::size_t count) noexcept {
  std::size_t bytes = 0;
  std::uint64_t prev_plus_one = 0;
  for (std::size_t b = 0; b < count; b += kIndexBlock) {
    const std::size_t m = std::min(kIndexBlock, count - b);
    std::uint64_t any = 0;
    for (std::size_t j = 0; j < m; ++j) {
      any |= idx[b + j] - prev_plus_one;
      prev_plus_one = idx[b + j] + 1;
    }
    bytes += 1 + static_cast<std::size_t>(block_bytes(m, static_cast<unsigned>(std::bit_width(any))));
  }
  return bytes;
}

std::size_t pack_indices(const std::uint64_t* idx, std::size_t count, std::byte* out) noexcept {
  std::byte* p = out;
  std::uint64_t prev_plus_one = 0;  // idx_{j-1} + 1, 0 before the first
  for (std::size_t b = 0; b < count; b += kIndexBlock) {
    const std::size_t m = std::min(kIndexBlock, count - b);
    std::uint64_t gaps[kIndexBlock];
    std::uint64_t any = 0;
    for (std::size_t j = 0; j < m; ++j) {
      gaps[j] = idx[b + j] - prev_plus_one;
      prev_plus_one = idx[b + j] + 1;
      any |= gaps[j];
    }
    const auto w = static_cast<unsigned>(std::bit_width(any));
    *p++ = static_cast<std::byte>(w);
    // A 128-bit accumulator: up to 64 bits of a gap on top of up to 7 pending bits.
    unsigned __int128 acc = 0;
    unsigned bits = 0;
    for (std::size_t j = 0; j < m; ++j) {
      acc |= static_cast<unsigned __int128>(gaps[j]) << bits;
      bits += w;
      while (bits >= 8) {
        *p++ = static_cast<std::byte>(static_cast<std::uint8_t>(acc));
        acc >>= 8;
        bits -= 8;
      }
    }
    if (bits > 0) *p++ = static_cast<std::byte>(static_cast<std::uint8_t>(acc));
  }
  return static_cast<std::size_t>(p - out);
}

double expected_packed_index_bytes(double density) noexcept {
  if (!(density > 0)) return 8.0;  // no entries: nothing to weigh; a whole index at most
  if (density >= 1) return 1.0 / kIndexBlock;  // every gap 0: the width byte alone
  const double log_miss = std::log1p(-density);  // ln P(gap >= 1)
  double width = 0;
  for (int b = 0; b < 64; ++b) {
    // P(gap >= 2^b) = (1 - d)^(2^b); P(the largest of a block's gaps >= 2^b):
    const double one = std::exp(std::ldexp(log_miss, b));
    const double any = -std::expm1(static_cast<double>(kIndexBlock) * std::log1p(-one));
    if (any < 1e-12) break;
    width += any;
  }
  return (1.0 + static_cast<double>(kIndexBlock) * width / 8.0) / kIndexBlock;
}

void unpack_indices(std::span<const std::byte> in, std::uint64_t count, std::uint64_t n,
                    std::uint64_t* out) {
  const std::byte* p = in.data();
  const std::byte* end = p + in.size();
  std::uint64_t next = 0;  // the smallest value the next index may take
  for (std::uint64_t b = 0; b < count; b += kIndexBlock) {
    const std::uint64_t m = std::min<std::uint64_t>(kIndexBlock, count - b);
    if (p == end) bad_indices("the stream ends before block " + std::to_string(b / kIndexBlock));
    const auto w = static_cast<unsigned>(*p++);
    if (w > 64) bad_indices("a block's width is " + std::to_string(w) + " bits");
    const std::uint64_t bytes = block_bytes(m, w);
    if (static_cast<std::uint64_t>(end - p) < bytes) bad_indices("a block runs past the end");
    const std::uint64_t mask = w == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << w) - 1;
    unsigned __int128 acc = 0;
    unsigned bits = 0;
    const std::byte* q = p;
    for (std::uint64_t j = 0; j < m; ++j) {
      while (bits < w) {
        acc |= static_cast<unsigned __int128>(static_cast<std::uint8_t>(*q++)) << bits;
        bits += 8;
      }
      const std::uint64_t gap = static_cast<std::uint64_t>(acc) & mask;
      acc = w == 64 ? acc >> 64 : acc >> w;
      bits -= w;
      // next + gap < n, without overflow.
      if (next >= n || gap > n - 1 - next) bad_indices("an index at or beyond n = " + std::to_string(n));
      out[b + j] = next + gap;
      next = out[b + j] + 1;
    }
    if (acc != 0) bad_indices("nonzero padding bits");
    p += bytes;
  }
  if (p != end) bad_indices(std::to_string(end - p) + " bytes beyond the last block");
}

}  // namespace gcomp::detail
