// Exact selection of the k elements with the largest 32-bit keys, ties to the lower index, output
// in ascending index order. Top-k uses the float bits of |x| as the key (monotone in |x|);
// random-k uses a Philox draw per element, so the k largest draws are a uniformly random subset.
//
// Fast path (one pass over the data): estimate the k-th key from a strided sample of 8192 keys,
// take a lower bound t_lo a few standard deviations below it, and collect every element with
// key >= t_lo as a candidate (about 1.3 k of them) in index order. The exact k-th key T among the
// candidates decides: take key > T, and key == T while ties remain. The sample only affects speed:
// when the candidates number fewer than k, or too many to be worth it, the exact path runs:
// three histogram passes (11, 11 and 10 key bits) find T, and one pass emits.
//
// Source is a concept: first(b, e, keys) computes the keys of [b, e) once, in order, and may have
// side effects (error feedback writes v = x + e there); it returns true when it met a non-finite
// value. again(b, e, keys) recomputes keys without side effects, and at(i) gives one key. Chunk
// boundaries handed to first/again are multiples of 32 (Philox groups).
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <vector>

#include "chunks.hpp"
#include "kernels.hpp"
#include "parallel.hpp"

namespace gcomp::detail {

// The scratch vectors (parallel.hpp) the selection uses, named.
struct SelectSample;
struct SelectCandidates;
struct SelectKeys;

struct Candidate {
  std::uint64_t index;
  std::uint32_t key;
};

inline constexpr std::size_t kSelectChunk = std::size_t{1} << 16;  // multiple of 32
inline constexpr std::size_t kKeyBlock = 2048;

struct SelectResult {
  bool nonfinite = false;  // Source::first met a non-finite value (the indices are then unusable)
  bool fast_path = true;
};

namespace select_impl {

// The key at rank k-1 (0-based, descending) of keys[0..m), reordering keys.
inline std::uint32_t kth_largest(std::vector<std::uint32_t>& keys, std::size_t k) {
  std::nth_element(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(k - 1), keys.end(),
                   [](std::uint32_t a, std::uint32_t b) { return a > b; });
  return keys[k - 1];
}

}  // namespace select_impl

namespace select_impl {

// A pass for the keys' side effects and the non-finite check alone (k = 0 or k >= n); returns
// whether a value was not finite.
template <class Source>
bool keys_only(Source& src, std::size_t n) {
  std::atomic<bool> bad{false};
  for_chunks(n, kSelectChunk, [&](std::size_t b, std::size_t e) {
    std::uint32_t keys[kKeyBlock];
    for (std::size_t s = b; s < e; s += kKeyBlock) {
      if (src.first(s, std::min(e, s + kKeyBlock), keys)) bad.store(true);
    }
  });
  return bad.load();
}

// The fast path's lower bound t_lo of the k-th key, from a strided sample of the keys, and how
// many candidates are worth collecting; usable false when the bound would take about every
// element.
struct SampledBound {
  std::uint32_t t_lo = 0;
  std::size_t cap = 0;
  bool usable = false;
};
template <class Source>
SampledBound sampled_bound(Source& src, std::size_t n, std::size_t k) {
  constexpr std::size_t kSample = 8192;
  const std::size_t samples = std::min(n, kSample);
  std::vector<std::uint32_t>& sample = scratch_vector<std::uint32_t, SelectSample>();
  sample.resize(samples);
  for (std::size_t j = 0; j < samples; ++j) {
    sample[j] = src.at(static_cast<std::size_t>((static_cast<unsigned __int128>(j) * n) / samples));
  }
  // Expected sample hits above the true threshold: samples * k / n; go 25% and 4 sigma beyond.
  const double expect =
      static_cast<double>(samples) * static_cast<double>(k) / static_cast<double>(n);
  const double rank_d = expect * 1.25 + 4.0 * std::sqrt(expect) + 8.0;
  SampledBound b;
  b.usable = rank_d < static_cast<double>(samples) * 0.5;  // else candidates ~ everything
  if (b.usable) b.t_lo = kth_largest(sample, static_cast<std::size_t>(rank_d));
  b.cap = std::max<std::size_t>(
      3 * static_cast<std::size_t>(rank_d / static_cast<double>(samples) * static_cast<double>(n)),
      std::size_t{1} << 16);
  return b;
}

// The one pass of the fast path: every key computed (with its side effects), the elements with
// key >= t_lo collected per chunk in index order, unless they overflow the bound's cap (or it
// is unusable). Returns whether they did.
template <class Source>
bool collect_candidates(Source& src, std::size_t n, const SampledBound& bound,
                        std::vector<std::vector<Candidate>>& per_chunk, std::size_t& total,
                        bool& nonfinite) {
  const std::size_t chunks = static_cast<std::size_t>(ceil_div(n, kSelectChunk));
  if (per_chunk.size() < chunks) per_chunk.resize(chunks);
  std::atomic<bool> bad{false};
  std::atomic<std::size_t> count{0};
  std::atomic<bool> overflow{!bound.usable};
  parallel_for(chunks, threads_for(n), [&](std::size_t c) {
    const std::size_t b = c * kSelectChunk;
    const std::size_t e = std::min(n, b + kSelectChunk);
    std::vector<Candidate>& cand = per_chunk[c];
    cand.clear();
    std::uint32_t keys[kKeyBlock];
    std::uint32_t pos[kKeyBlock + 16];
    for (std::size_t s = b; s < e; s += kKeyBlock) {
      const std::size_t l = std::min(e, s + kKeyBlock) - s;
      if (src.first(s, s + l, keys)) bad.store(true, std::memory_order_relaxed);
      if (overflow.load(std::memory_order_relaxed)) continue;
      const std::size_t m = positions_at_least(keys, l, bound.t_lo, pos);
      for (std::size_t j = 0; j < m; ++j) cand.push_back({s + pos[j], keys[pos[j]]});
    }
    if (count.fetch_add(cand.size()) + cand.size() > bound.cap) overflow.store(true);
  });
  nonfinite = bad.load();
  total = count.load();
  return overflow.load();
}

// The k largest among the candidates (at least k of them), ties to the lower index, into out.
inline void take_from_candidates(const std::vector<std::vector<Candidate>>& per_chunk,
                                 std::size_t chunks, std::size_t k,
                                 std::vector<std::uint64_t>& out) {
  std::vector<std::uint32_t>& keys = scratch_vector<std::uint32_t, SelectKeys>();
  keys.clear();
  for (std::size_t c = 0; c < chunks; ++c) {
    for (const Candidate& cd : per_chunk[c]) keys.push_back(cd.key);
  }
  const std::uint32_t t = kth_largest(keys, k);
  std::size_t greater = 0;
  for (std::uint32_t key : keys) greater += key > t;
  std::size_t ties = k - greater;
  out.reserve(k);
  for (std::size_t c = 0; c < chunks; ++c) {
    for (const Candidate& cd : per_chunk[c]) {
      if (cd.key > t || (cd.key == t && ties > 0)) {
        if (cd.key == t) --ties;
        out.push_back(cd.index);
      }
    }
  }
}

// The exact path: radix over 11 + 11 + 10 key bits (keys recomputed without side effects), then
// one emitting pass.
template <class Source>
void radix_select(Source& src, std::size_t n, std::size_t k, std::vector<std::uint64_t>& out) {
  const std::size_t chunks = static_cast<std::size_t>(ceil_div(n, kSelectChunk));
  std::uint32_t prefix = 0;  // the key bits fixed so far
  std::size_t need = k;      // how many of the elements matching the prefix are still needed
  const int shifts[3] = {21, 10, 0};
  const std::uint32_t widths[3] = {11, 11, 10};
  std::vector<std::vector<std::uint64_t>> hist(chunks);
  for (int level = 0; level < 3; ++level) {
    const int shift = shifts[level];
    const std::uint32_t bins = 1u << widths[level];
    const int hi_shift = shift + static_cast<int>(widths[level]);  // bits above this level
    parallel_for(chunks, threads_for(n), [&](std::size_t c) {
      const std::size_t b = c * kSelectChunk;
      const std::size_t e = std::min(n, b + kSelectChunk);
      std::vector<std::uint64_t>& h = hist[c];
      h.assign(bins, 0);
      std::uint32_t keys[kKeyBlock];
      for (std::size_t s = b; s < e; s += kKeyBlock) {
        const std::size_t l = std::min(e, s + kKeyBlock) - s;
        src.again(s, s + l, keys);
        for (std::size_t i = 0; i < l; ++i) {
          const std::uint32_t key = keys[i];
          const bool match = hi_shift >= 32 || (key >> hi_shift) == (prefix >> hi_shift);
          if (match) ++h[(key >> shift) & (bins - 1)];
        }
      }
    });
    std::vector<std::uint64_t> sum(bins, 0);
    for (std::size_t c = 0; c < chunks; ++c) {
      for (std::uint32_t j = 0; j < bins; ++j) sum[j] += hist[c][j];
    }
    std::uint32_t bin = bins - 1;
    while (true) {
      if (sum[bin] >= need) break;
      need -= sum[bin];
      --bin;  // the counts add up to at least `need`, so this stops at bin 0 at the latest
    }
    prefix |= bin << shift;
  }
  const std::uint32_t t = prefix;
  std::size_t ties = need;  // elements equal to t still to take, in index order
  out.reserve(k);
  std::uint32_t keys[kKeyBlock];
  for (std::size_t s = 0; s < n; s += kKeyBlock) {
    const std::size_t l = std::min(n, s + kKeyBlock) - s;
    src.again(s, s + l, keys);
    for (std::size_t i = 0; i < l; ++i) {
      if (keys[i] > t || (keys[i] == t && ties > 0)) {
        if (keys[i] == t) --ties;
        out.push_back(s + i);
      }
    }
  }
}

}  // namespace select_impl

template <class Source>
SelectResult select_top(Source& src, std::size_t n, std::size_t k,
                        std::vector<std::uint64_t>& out) {
  SelectResult res;
  out.clear();
  if (k >= n || k == 0) {  // every element or none: the keys' side effects and check only
    res.nonfinite = select_impl::keys_only(src, n);
    if (k > 0) {
      out.resize(n);
      for (std::size_t i = 0; i < n; ++i) out[i] = i;
    }
    return res;
  }
  const select_impl::SampledBound bound = select_impl::sampled_bound(src, n, k);
  auto& per_chunk = scratch_vector<std::vector<Candidate>, SelectCandidates>();
  std::size_t total = 0;
  const bool overflow =
      select_impl::collect_candidates(src, n, bound, per_chunk, total, res.nonfinite);
  if (res.nonfinite) return res;
  if (!overflow && total >= k) {
    select_impl::take_from_candidates(per_chunk,
                                      static_cast<std::size_t>(ceil_div(n, kSelectChunk)), k, out);
    return res;
  }
  res.fast_path = false;
  select_impl::radix_select(src, n, k, out);
  return res;
}

}  // namespace gcomp::detail
