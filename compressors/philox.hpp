// Counter-based randomness for the stochastic codecs: Random123's Philox4x32-10, laid out as one
// stream of 32-bit words per (seed, codec) so that every draw is a pure function of
// (seed, codec, element index) and a GPU thread can compute any part of it on its own.
//
//   block b (a 64-bit counter) gives Philox4x32-10(ctr = {lo32(b), hi32(b), codec id, 0},
//                                                  key = {lo32(seed), hi32(seed)}) = 4 words
//   the stream, in groups of 8 blocks:  S[32g + 8w + j] = word w of block 8g + j
//
// A codec that needs 32 random bits per element uses S[i] for element i (random-k); one that
// needs 16 uses half (i & 1) of S[i >> 1], low half first, i.e. the stream read as 16-bit words
// (QSGD, TernGrad). The word-major order inside a group is what an 8-lane SIMD generator
// produces natively. philox_word() (Random123 itself) is the reference; philox_fill() is the
// fast path and the tests check that the two agree.
#pragma once

#include <Random123/philox.h>

#include <cstddef>
#include <cstdint>

#include "gcomp/codec.hpp"

namespace gcomp::detail {

struct PhiloxStream {
  std::uint32_t k0;
  std::uint32_t k1;
  std::uint32_t codec;
};

inline PhiloxStream philox_stream(std::uint64_t seed, CodecKind kind) noexcept {
  return {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32),
          static_cast<std::uint32_t>(kind)};
}

// Word i of the stream, computed with Random123.
inline std::uint32_t philox_word(const PhiloxStream& s, std::uint64_t i) noexcept {
  const std::uint64_t g = i >> 5;
  const std::uint32_t w = static_cast<std::uint32_t>(i >> 3) & 3u;
  const std::uint64_t block = 8 * g + (i & 7u);
  r123::Philox4x32 rng;
  const r123::Philox4x32::ctr_type ctr = {
      {static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32), s.codec, 0}};
  const r123::Philox4x32::key_type key = {{s.k0, s.k1}};
  return rng(ctr, key)[w];
}

// The 16-bit draw of element i.
inline std::uint16_t philox_half(const PhiloxStream& s, std::uint64_t i) noexcept {
  const std::uint32_t w = philox_word(s, i >> 1);
  return static_cast<std::uint16_t>((i & 1) ? (w >> 16) : (w & 0xffffu));
}

// out[0..count) = S[first .. first + count); first and count must be multiples of 32.
void philox_fill(const PhiloxStream& s, std::uint64_t first, std::size_t count,
                 std::uint32_t* out) noexcept;

// The same with Random123 only (the reference the fast path is tested against).
void philox_fill_reference(const PhiloxStream& s, std::uint64_t first, std::size_t count,
                           std::uint32_t* out) noexcept;

}  // namespace gcomp::detail
