// The sparse vectors the sparse algorithms exchange (see sparse_vector.hpp).
#include "sparse_vector.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "gcomp/error.hpp"
#include "half.hpp"
#include "index_pack.hpp"

namespace gcomp::detail {

namespace {
constexpr std::uint64_t kFullBit = std::uint64_t{1} << 63;
constexpr std::uint64_t kHalfBit = std::uint64_t{1} << 62;

// Every value finite and within binary16's range: it rounds to a finite half, not a saturated
// one.
bool fits_half(const std::vector<float>& v) {
  for (float x : v) {
    if (!(std::fabs(x) <= kHalfMax)) return false;
  }
  return true;
}

// The indexed s in full, in place: entry j's value v goes to its index i as at(i, v) (from the
// last entry, so none is overwritten before it is read: idx[j] >= j) and every other position
// q becomes fill(q). Both vectors keep their capacity, so a warm vector allocates nothing.
template <class At, class Fill>
void expand(SparseVector& s, At at, Fill fill) {
  std::vector<float>& v = s.val;
  const std::size_t m = s.idx.size();
  v.resize(s.n);
  std::uint64_t end = s.n;  // (idx[j], end) is filled
  for (std::size_t j = m; j-- > 0;) {
    const std::uint64_t i = s.idx[j];
    const float mine = v[j];
    for (std::uint64_t q = i + 1; q < end; ++q) v[q] = fill(q);
    v[i] = at(i, mine);
    end = i;
  }
  for (std::uint64_t q = 0; q < end; ++q) v[q] = fill(q);
  s.idx.clear();
  s.full = true;
}

void to_full(SparseVector& s) {
  if (!s.full) {
    expand(
        s, [](std::uint64_t, float v) { return v; }, [](std::uint64_t) { return 0.0f; });
  }
}

[[noreturn]] void bad_vector(const std::string& why) {
  throw Error(Status::bad_payload, "bad sparse vector from a peer: " + why);
}
}  // namespace

std::size_t SparseVector::wire_bytes_bound() const {
  return 8 + (full ? 4 * n : 4 * idx.size() + packed_indices_bound(idx.size(), n));
}

void merge_into(SparseVector& acc, const SparseVector& other) {
  if (acc.full || other.full || goes_full(acc.entries() + other.entries(), acc.n)) {
    if (!acc.full && other.full) {
      // Start from the full side so that each sum reads other + acc, as the partner computes
      // (where acc has no entry the value is other's own, -0 included).
      expand(
          acc, [&](std::uint64_t i, float v) { return other.val[i] + v; },
          [&](std::uint64_t q) { return other.val[q]; });
      return;
    }
    to_full(acc);
    if (other.full) {
      for (std::uint64_t i = 0; i < acc.n; ++i) acc.val[i] += other.val[i];
    } else {
      for (std::size_t j = 0; j < other.idx.size(); ++j) acc.val[other.idx[j]] += other.val[j];
    }
    return;
  }
  // In place, from the back: acc grows to hold both, the merge writes from the top down (a write
  // at w - 1 >= a + b - 1 never reaches acc's unread entries [0, a)), and the merged part then
  // closes the gap left by equal indices. acc keeps its capacity, so a warm vector allocates
  // nothing and what the workspace holds does not depend on the last call's sizes.
  const std::size_t na = acc.idx.size(), nb = other.idx.size();
  acc.idx.resize(na + nb);
  acc.val.resize(na + nb);
  std::size_t a = na, b = nb, w = na + nb;
  while (b > 0) {
    --w;
    if (a > 0 && acc.idx[a - 1] > other.idx[b - 1]) {
      --a;
      acc.idx[w] = acc.idx[a];
      acc.val[w] = acc.val[a];
    } else if (a > 0 && acc.idx[a - 1] == other.idx[b - 1]) {
      --a;
      --b;
      acc.idx[w] = acc.idx[a];
      acc.val[w] = acc.val[a] + other.val[b];
    } else {
      --b;
      acc.idx[w] = other.idx[b];
      acc.val[w] = other.val[b];
    }
  }
  // acc's entries below a are the smallest and already in place: the merged part, at [w, na +
  // nb), moves down to follow them (forward: each write lands below what is still to be read).
  const std::size_t merged = na + nb - w;
  if (w > a) {
    for (std::size_t j = 0; j < merged; ++j) {
      acc.idx[a + j] = acc.idx[w + j];
      acc.val[a + j] = acc.val[w + j];
    }
  }
  acc.idx.resize(a + merged);
  acc.val.resize(a + merged);
}

bool round_to_half(SparseVector& s) {
  if (!fits_half(s.val)) return false;
  for (float& v : s.val) v = half_to_float(float_to_half(v));
  return true;
}

bool serialize(const SparseVector& s, std::vector<std::byte>& out, bool half) {
  half = half && fits_half(s.val);
  out.resize(s.wire_bytes_bound());
  const std::uint64_t head = (s.full ? kFullBit : 0) | (half ? kHalfBit : 0) | s.entries();
  std::memcpy(out.data(), &head, 8);
  std::byte* p = out.data() + 8;
  if (half) {
    for (float v : s.val) {
      const std::uint16_t h = float_to_half(v);
      std::memcpy(p, &h, 2);
      p += 2;
    }
  } else {
    if (!s.val.empty()) std::memcpy(p, s.val.data(), 4 * s.val.size());
    p += 4 * s.val.size();
  }
  if (!s.full) p += pack_indices(s.idx.data(), s.idx.size(), p);
  out.resize(static_cast<std::size_t>(p - out.data()));
  return half;
}

namespace {
// `count` values from `in` (float32, or binary16: finite ones only) into `out`.
void read_values(const std::byte* in, std::uint64_t count, bool half, std::vector<float>& out) {
  out.resize(count);
  if (!half) {
    if (count > 0) std::memcpy(out.data(), in, 4 * count);
    return;
  }
  for (std::uint64_t j = 0; j < count; ++j) {
    std::uint16_t h;
    std::memcpy(&h, in + 2 * j, 2);
    if (!half_is_finite(h)) bad_vector("a binary16 value that is not finite");
    out[j] = half_to_float(h);
  }
}
}  // namespace

void deserialize(std::span<const std::byte> in, std::uint64_t n, SparseVector& out) {
  if (in.size() < 8) bad_vector("shorter than its header");
  std::uint64_t head;
  std::memcpy(&head, in.data(), 8);
  out.n = n;
  out.full = (head & kFullBit) != 0;
  const bool half = (head & kHalfBit) != 0;
  const std::uint64_t width = half ? 2 : 4;
  const std::uint64_t count = head & ~(kFullBit | kHalfBit);
  if (out.full) {
    if (count != n || in.size() != 8 + width * n) bad_vector("full vector of the wrong size");
    out.idx.clear();
    read_values(in.data() + 8, n, half, out.val);
    return;
  }
  if (count > n || (in.size() - 8) / width < count) bad_vector("sparse stream of the wrong size");
  read_values(in.data() + 8, count, half, out.val);
  out.idx.resize(count);
  try {
    unpack_indices(in.subspan(8 + width * count), count, n, out.idx.data());
  } catch (const Error& e) {
    bad_vector(e.what());
  }
}

void write_out(const SparseVector& s, std::span<float> out, float scale) {
  if (s.full) {
    if (scale == 1.0f) {
      std::copy(s.val.begin(), s.val.end(), out.begin());
    } else {
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = s.val[i] * scale;
    }
    return;
  }
  std::fill(out.begin(), out.end(), 0.0f);
  for (std::size_t j = 0; j < s.idx.size(); ++j) out[s.idx[j]] = s.val[j] * scale;
}

void slice(const SparseVector& s, std::uint64_t lo, std::uint64_t hi, SparseVector& out) {
  out.n = hi - lo;
  out.full = s.full;
  if (s.full) {
    out.idx.clear();
    out.val.assign(s.val.begin() + static_cast<std::ptrdiff_t>(lo),
                   s.val.begin() + static_cast<std::ptrdiff_t>(hi));
    return;
  }
  const auto b = std::lower_bound(s.idx.begin(), s.idx.end(), lo);
  const auto e = std::lower_bound(b, s.idx.end(), hi);
  out.idx.resize(static_cast<std::size_t>(e - b));
  out.val.resize(out.idx.size());
  const auto off = static_cast<std::size_t>(b - s.idx.begin());
  for (std::size_t j = 0; j < out.idx.size(); ++j) {
    out.idx[j] = s.idx[off + j] - lo;
    out.val[j] = s.val[off + j];
  }
}

}  // namespace gcomp::detail
