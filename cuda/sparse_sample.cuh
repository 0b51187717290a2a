// Top-k of a large tensor from a sample (sparse.cu's first comment explains the whole): the
// sample's keys, the one filtering pass over the tensor and the candidates put in order.
// Included by sparse.cu only (its kernels live in that file's anonymous namespace).
#pragma once

#include "sparse_select.cuh"

namespace gcomp::cuda::detail {
namespace {

// ---- top-k's threshold from a sample ----

constexpr std::size_t kSampleMin = std::size_t{1} << 20;  // smaller tensors: the select alone
constexpr std::size_t kSampleMax = std::size_t{1} << 18;
constexpr int kFilterUnroll = 8;
constexpr unsigned kFilterBuffer = 2 * 32 * kFilterUnroll;  // a warp's entries: two rounds

// The sample's keys (v = x + e as the first pass adds them) and the histogram of their top 11
// bits: the threshold is then the sample's rank-th largest key to 22 bits (two levels of the
// radix select on the sample; the lower edge of the bin, so at least rank sample keys are at or
// above it).
__global__ void sample_kernel(const float* __restrict__ x, const float* __restrict__ e_old,
                              std::size_t n, std::size_t m, std::uint32_t* __restrict__ out,
                              unsigned long long* hist) {
  __shared__ unsigned counts[kBins];
  for (unsigned b = threadIdx.x; b < kBins; b += blockDim.x) counts[b] = 0;
  __syncthreads();
  GCOMP_GRID_LOOP(s, m) {
    const std::size_t i = sample_index(s, n, m);
    float v = x[i];
    if (e_old) v = v + e_old[i];
    const std::uint32_t key = __float_as_uint(v) & 0x7fffffffu;
    out[s] = key;
    count_bin(counts, key >> 21);
  }
  __syncthreads();
  for (unsigned b = threadIdx.x; b < kBins; b += blockDim.x) {
    if (counts[b]) atomicAdd(&hist[b], static_cast<unsigned long long>(counts[b]));
  }
}

// One flush of a warp's buffer in the filter: `count` entries at `at` in the unordered buffer,
// which are entries [before, before + count) of warp `warp`'s own (ascending) candidates.
struct Flush {
  unsigned long long at;
  unsigned long long before;
  unsigned long long warp;
  unsigned long long count;
};

// Where the filter's candidates go: indices and values in flush order, the flushes, each warp's
// total. Past a capacity only the counts grow, which the host sees.
template <class Index>
struct Filtered {
  Index* index;
  float* value;
  unsigned long long* count;
  std::size_t capacity;
  Flush* flushes;
  unsigned long long* flush_count;
  std::size_t flush_capacity;
  unsigned long long* warp_totals;
};

// The one pass over the tensor: v = x + e into e_new (error feedback), the non-finite check,
// and the elements whose key is at or above *threshold (index and value) into `to`. Each warp
// reads its own stretch of `chunk` elements (a multiple of 32 * kFilterUnroll) in order, so
// its candidates come in ascending order; they gather in the warp's buffer in shared memory and
// go out a buffer at a time at one global atomic's offset, each flush recorded (Flush), so that
// order_kernel can put every flush in its place without a sort. Whole rounds load without
// guards (all loads in flight at once).
template <bool EF, class Index>
__global__ void __launch_bounds__(kThreads)
    filter_kernel(const float* __restrict__ x, const float* __restrict__ e_old,
                  float* __restrict__ e_new, std::size_t n, std::size_t chunk,
                  const std::uint32_t* __restrict__ threshold, Filtered<Index> to, Report* r) {
  constexpr int U = kFilterUnroll;
  constexpr unsigned kRound = 32 * U;
  __shared__ Index buffer[kThreads / 32][kFilterBuffer];
  __shared__ float values[kThreads / 32][kFilterBuffer];
  const std::uint32_t t = *threshold;
  const unsigned lane = threadIdx.x & 31u;
  const unsigned warp = threadIdx.x / 32;
  const std::size_t gw = blockIdx.x * static_cast<std::size_t>(kThreads / 32) + warp;
  Index* mine = buffer[warp];
  float* mine_v = values[warp];
  unsigned held = 0;               // the same in every lane of the warp
  unsigned long long before = 0;  // the warp's candidates flushed so far
  bool bad = false;
  const auto flush = [&]() {
    __syncwarp();
    unsigned long long at = 0;
    if (lane == 0) {
      at = atomicAdd(to.count, static_cast<unsigned long long>(held));
      const unsigned long long f = atomicAdd(to.flush_count, 1ull);
      if (f < to.flush_capacity) to.flushes[f] = Flush{at, before, gw, held};
    }
    at = __shfl_sync(0xffffffffu, at, 0);
    for (unsigned j = lane; j < held; j += 32) {
      if (at + j < to.capacity) {
        to.index[at + j] = mine[j];
        to.value[at + j] = mine_v[j];
      }
    }
    __syncwarp();
    before += held;
    held = 0;
  };
  const std::size_t begin = gw * chunk;
  const std::size_t end = begin + chunk < n ? begin + chunk : n;
  // The loop's test is the same for the whole warp (the ballots need every lane).
  for (std::size_t base = begin; base < end; base += kRound) {
    const std::size_t i0 = base + lane;
    float vs[U];
    if (base + kRound <= end) {
#pragma unroll
      for (int u = 0; u < U; ++u) vs[u] = x[i0 + 32 * u];
      if (EF) {
        float es[U];
#pragma unroll
        for (int u = 0; u < U; ++u) es[u] = e_old[i0 + 32 * u];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          vs[u] = vs[u] + es[u];
          e_new[i0 + 32 * u] = vs[u];
        }
      }
    } else {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const std::size_t i = i0 + 32 * u;
        vs[u] = 0.0f;
        if (i < end) {
          vs[u] = x[i];
          if (EF) {
            vs[u] = vs[u] + e_old[i];
            e_new[i] = vs[u];
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const std::size_t i = i0 + 32 * u;
      const bool valid = i < end;
      bad |= valid && nonfinite(vs[u]);
      const bool match = valid && (__float_as_uint(vs[u]) & 0x7fffffffu) >= t;
      const unsigned ballot = __ballot_sync(0xffffffffu, match);
      if (match) {
        const unsigned at = held + __popc(ballot & ((1u << lane) - 1u));
        mine[at] = static_cast<Index>(i);
        mine_v[at] = vs[u];
      }
      held += static_cast<unsigned>(__popc(ballot));
    }
    // A round adds at most kRound: flush before the next one could overflow.
    if (held > kFilterBuffer - kRound) flush();
  }
  if (held > 0) flush();
  if (lane == 0) to.warp_totals[gw] = before;
  if (bad) report_nonfinite(r);
}

// Every flush to its place: warp w's candidates start at warp_offsets[w] (a scan of the warps'
// totals), a flush's at its `before` past that. A warp per flush. The result is the candidates
// in ascending index order, with their values.
template <class Index>
__global__ void order_kernel(Filtered<Index> from, const unsigned long long* __restrict__ warp_offsets,
                             Index* __restrict__ index, float* __restrict__ value) {
  const std::size_t flushes = static_cast<std::size_t>(*from.flush_count);
  const unsigned lane = threadIdx.x & 31u;
  const std::size_t warps = static_cast<std::size_t>(gridDim.x) * (blockDim.x / 32);
  for (std::size_t f = blockIdx.x * static_cast<std::size_t>(blockDim.x / 32) + threadIdx.x / 32;
       f < flushes; f += warps) {
    const Flush fl = from.flushes[f];
    const unsigned long long to = warp_offsets[fl.warp] + fl.before;
    for (unsigned long long j = lane; j < fl.count; j += 32) {
      index[to + j] = from.index[fl.at + j];
      value[to + j] = from.value[fl.at + j];
    }
  }
}

}  // namespace
}  // namespace gcomp::cuda::detail
