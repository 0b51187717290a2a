// Compact sparse indices: strictly increasing indices below n, written as the gaps between them
// (gap_0 = idx_0, gap_j = idx_j - idx_{j-1} - 1), bit-packed in blocks of 128. Each block is one
// byte w (the bit width of its largest gap, 0..64) and then its gaps at w bits each, in the
// bit order of QSGD's codes (bit b of the stream is bit b mod 8 of byte b / 8, least significant
// first); a block of 128 gaps is 16 w bytes, the last block of m gaps ceil(m w / 8) with its
// unused high bits zero. Top-k of 1% of a tensor has gaps of about 100: 7-8 bits an index where
// a u32 takes 32. docs/wire-format.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace gcomp::detail {

inline constexpr std::size_t kIndexBlock = 128;

// The width of an index below n written whole (payload version 1, and the CUDA decoder's
// unpacked form): 4 bytes up to n = 2^32, else 8. The one place this rule lives.
constexpr std::size_t index_width(std::uint64_t n) noexcept {
  return n <= (std::uint64_t{1} << 32) ? 4 : 8;
}

// The most bytes `count` indices below n can take.
std::size_t packed_indices_bound(std::uint64_t count, std::uint64_t n) noexcept;

// The expected bytes per index of packed indices whose gaps are those of a random support of
// the given density (entries / range, 0 < density <= 1): gaps geometric, a block's width the
// bit width of the largest of its 128, E[w] = sum_b P(max >= 2^b) = sum_b 1 - (1 - (1-d)^(2^b))^128,
// and (1 + 16 E[w]) / 128 bytes an index. For 1%: 1.199 (9.53 bits and the width byte). The
// cost model's figure for the streams; a support with clustered gaps packs tighter.
double expected_packed_index_bytes(double density) noexcept;

// The bytes pack_indices writes for idx[0..count) (strictly increasing), without writing them.
std::size_t packed_indices_size(const std::uint64_t* idx, std::size_t count) noexcept;

// Writes idx[0..count) (strictly increasing) to out, which holds at least
// packed_indices_bound(count, n) bytes; returns the bytes written.
std::size_t pack_indices(const std::uint64_t* idx, std::size_t count, std::byte* out) noexcept;

// Reads exactly `count` indices from `in` (all of it, no more) into out[0..count); throws
// Error(bad_payload) unless every width is at most 64, the padding bits are zero, the bytes are
// exactly used up and every index is below n (strictly increasing by construction).
void unpack_indices(std::span<const std::byte> in, std::uint64_t count, std::uint64_t n,
                    std::uint64_t* out);

}  // namespace gcomp::detail
