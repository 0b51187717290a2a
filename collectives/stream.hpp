// SparCML's streams: a partial sum of sparse contributions in one of two representations,
// sparse (strictly ascending indices with float32 values) or dense (all n values); on the wire
// the values are float32, or binary16 for a codec with values=fp16. Merging two
// streams sums them; the result turns dense once (len_a + len_b) * (index + value bytes) reaches
// the dense size n * 4 (Renggli et al., SC 2019). Merges are commutative bit for bit (IEEE
// addition is), so two partners that merge each other's streams hold identical results.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "index_pack.hpp"

namespace gcomp::detail {



// True when a stream of `entries` (index, value) pairs is at least as large as the dense form.
inline bool goes_dense(std::uint64_t entries, std::uint64_t n) {
  return entries * (index_width(n) + 4) >= n * 4;
}

struct Stream {
  std::uint64_t n = 0;
  bool dense = false;
  std::vector<std::uint64_t> idx;  // sparse only
  std::vector<float> val;          // sparse: one per index; dense: n

  std::uint64_t entries() const { return dense ? n : idx.size(); }
  std::size_t wire_bytes_bound() const;  // serialize's output is at most this long
};

// acc = acc + other (same n), switching to dense by the byte rule.
void merge_into(Stream& acc, const Stream& other);

// Wire form (docs/wire-format.md, "Streams"): u64 header (bit 63: dense; bit 62: binary16
// values; low bits: entry count), the values, and for a sparse stream its indices packed as
// gaps (compressors/index_pack.hpp) to the end. With `half` (a codec with values=fp16) the
// values go as IEEE binary16, rounded to nearest even, where every one of them is within the
// format's range (|v| <= 65504, finite), else as float32; returns whether they went as halves.
// A receiver reads the rounded values: a sender that goes on using its own stream (recursive
// doubling's partners, which must hold the same sums) rounds it first with round_to_half.
bool serialize(const Stream& s, std::vector<std::byte>& out, bool half = false);
// Every value rounded to binary16 and back, where all of them are within its range; returns
// whether it rounded (what serialize(s, out, true) then sends).
bool round_to_half(Stream& s);
// Checks sizes and index order; throws Error(bad_payload).
void deserialize(std::span<const std::byte> in, std::uint64_t n, Stream& out);

// out[0..n) = the stream's values times scale (zeros where a sparse stream has no entry): the
// same bits as writing them and multiplying after, in one pass (averaging: scale = 1 / P).
void write_out(const Stream& s, std::span<float> out, float scale = 1.0f);

// The part [lo, hi) of a stream (sparse: indices rebased to lo; dense: the values).
void slice(const Stream& s, std::uint64_t lo, std::uint64_t hi, Stream& out);

}  // namespace gcomp::detail
