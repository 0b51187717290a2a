// libFuzzer target: the sparse vectors the sparse algorithms exchange
// (collectives/algorithms/sparse_vector.hpp, docs/wire-format.md "Sparse vectors"), as a receiver reads them
// from another rank. Any bytes through deserialize() give a vector or Error(bad_payload), never a
// crash, a sanitizer report or a hang; a vector it accepts is well formed (n values when full; else
// strictly increasing indices below n, one value each), serialize() writes it back to bytes that
// read as the same vector bit for bit, and what the algorithms then do with it (write_out, slice,
// merge_into) runs. The first 4 bytes are the element count the receiver expects (below 2^16), the
// rest the wire. Build with GCOMP_FUZZ=ON (clang).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "gcomp/error.hpp"
#include "sparse_vector.hpp"

namespace {

using gcomp::detail::SparseVector;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 4) return 0;
  std::uint32_t head = 0;
  std::memcpy(&head, data, 4);
  const std::uint64_t n = head % (1u << 16);
  const std::span<const std::byte> wire(reinterpret_cast<const std::byte*>(data) + 4, size - 4);
  SparseVector v;
  try {
    gcomp::detail::deserialize(wire, n, v);
  } catch (const gcomp::Error&) {
    return 0;
  }
  // Well formed.
  if (v.n != n) __builtin_trap();
  if (v.full) {
    if (v.val.size() != n || !v.idx.empty()) __builtin_trap();
  } else {
    if (v.idx.size() != v.val.size()) __builtin_trap();
    for (std::size_t i = 0; i < v.idx.size(); ++i) {
      if (v.idx[i] >= n || (i > 0 && v.idx[i] <= v.idx[i - 1])) __builtin_trap();
    }
  }
  // Written back and read again: the same vector.
  std::vector<std::byte> again;
  gcomp::detail::serialize(v, again, false);
  if (again.size() > v.wire_bytes_bound()) __builtin_trap();
  SparseVector w;
  try {
    gcomp::detail::deserialize(again, n, w);
  } catch (const gcomp::Error&) {
    __builtin_trap();  // what serialize writes, deserialize reads
  }
  if (w.full != v.full || w.idx != v.idx || !same_bits(w.val, v.val)) __builtin_trap();
  // What the algorithms do next.
  std::vector<float> out(static_cast<std::size_t>(n));
  gcomp::detail::write_out(v, out, 0.5f);
  SparseVector part;
  gcomp::detail::slice(v, n / 3, n, part);
  if (part.n != n - n / 3) __builtin_trap();
  SparseVector acc = v;
  gcomp::detail::merge_into(acc, w);
  if (acc.n != n) __builtin_trap();
  return 0;
}
