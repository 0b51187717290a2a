// The sparse vectors the sparse algorithms exchange (SparCML's "streams"): a partial sum of
// sparse contributions in one of two representations, indexed (strictly ascending indices with
// float32 values) or full (all n values); on the wire the values are float32, or binary16 for a
// codec with values=fp16. Merging two vectors sums them; the result turns full once
// (len_a + len_b) * (index + value bytes) reaches the full size n * 4 (Renggli et al., SC 2019).
// Merges are commutative bit for bit (IEEE addition is), so two partners that merge each other's
// vectors hold identical results. (Only this type is a "sparse vector"; a "stream" in gcomp is
// a CUDA stream.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "index_pack.hpp"

namespace gcomp::detail {

// True when a vector of `entries` (index, value) pairs is at least as large as the full form.
inline bool goes_full(std::uint64_t entries, std::uint64_t n) {
  return entries * (index_width(n) + 4) >= n * 4;
}

struct SparseVector {
  std::uint64_t n = 0;
  bool full = false;               // every value present (idx empty), else indexed
  std::vector<std::uint64_t> idx;  // indexed only
  std::vector<float> val;          // indexed: one per index; full: n

  std::uint64_t entries() const { return full ? n : idx.size(); }
  std::size_t wire_bytes_bound() const;  // serialize's output is at most this long
};

// acc = acc + other (same n), switching to full by the byte rule.
void merge_into(SparseVector& acc, const SparseVector& other);

// Wire form (docs/wire-format.md, "Sparse vectors"): u64 header (bit 63: full; bit 62: binary16
// values; low bits: entry count), the values, and for a sparse stream its indices packed as
// gaps (compressors/index_pack.hpp) to the end. With `half` (a codec with values=fp16) the
// values go as IEEE binary16, rounded to nearest even, where every one of them is within the
// format's range (|v| <= 65504, finite), else as float32; returns whether they went as halves.
// A receiver reads the rounded values: a sender that goes on using its own stream (recursive
// doubling's partners, which must hold the same sums) rounds it first with round_to_half.
bool serialize(const SparseVector& s, std::vector<std::byte>& out, bool half = false);
// Every value rounded to binary16 and back, where all of them are within its range; returns
// whether it rounded (what serialize(s, out, true) then sends).
bool round_to_half(SparseVector& s);
// Checks sizes and index order; throws Error(bad_payload).
void deserialize(std::span<const std::byte> in, std::uint64_t n, SparseVector& out);

// out[0..n) = the stream's values times scale (zeros where a sparse stream has no entry): the
// same bits as writing them and multiplying after, in one pass (averaging: scale = 1 / P).
void write_out(const SparseVector& s, std::span<float> out, float scale = 1.0f);

// The part [lo, hi) of a stream (indexed: indices rebased to lo; full: the values).
void slice(const SparseVector& s, std::uint64_t lo, std::uint64_t hi, SparseVector& out);

}  // namespace gcomp::detail
