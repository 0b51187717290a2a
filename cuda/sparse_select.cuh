// The exact radix select of the sparse codecs' encode (sparse.cu's first comment explains the
// whole): the select's state and keys, the first pass, the histogram levels and their scans, the
// ties and the cut, and the ordered write of the selected indices by tiles. Included by sparse.cu
// only (its kernels live in that file's anonymous namespace).
#pragma once

#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <cfloat>

#include "codecs.cuh"
#include "radix_select.hpp"

namespace gcomp::cuda::detail {
namespace {

enum class Mode : int { topk, randomk, threshold };

constexpr unsigned kBins = 2048;
constexpr unsigned kTieTile = 4096;

struct SelectState {
  std::uint32_t prefix;      // key bits fixed so far; after the last level, T
  std::uint32_t all;         // every element is selected (k >= n)
  std::uint32_t done;        // early stop: every key >= prefix is taken (no more levels)
  std::uint32_t pad;
  unsigned long long need;   // elements equal to the prefix still needed; after the last level, ties
  unsigned long long equal;  // elements whose key equals T
  unsigned long long cut;    // the last index with key == T to take
  unsigned long long first_bin;  // elements in the first level's bin: the candidates' number
  unsigned long long cut_tile;   // the tile of the cut (~0: every tie is taken)
  unsigned long long cut_rank;   // the cut's rank among its tile's ties (1 = the first)
};

// The key of element i: |v| bits, or word i of the Philox stream (compressors/philox.hpp).
struct Keys {
  const float* v;
  Mode mode;
  std::uint32_t k0, k1, codec;
  __device__ __forceinline__ std::uint32_t operator()(std::uint64_t i) const {
    if (mode == Mode::randomk) {
      const std::uint64_t g = i >> 5;
      const unsigned w = static_cast<unsigned>(i >> 3) & 3u;
      const uint4 r = philox_block(k0, k1, codec, 8 * g + (i & 7u));
      return w == 0 ? r.x : (w == 1 ? r.y : (w == 2 ? r.z : r.w));
    }
    return abs_key(i);
  }
  // Top-k's key alone: kernels that take several keys at once choose between the two kinds
  // outside their loops, so that the loads of a round are all in flight before the first use.
  __device__ __forceinline__ std::uint32_t abs_key(std::uint64_t i) const {
    return __float_as_uint(v[i]) & 0x7fffffffu;
  }
};

// One count for `bin` in a block's shared histogram: a plain shared atomic. Aggregating the
// lanes of a warp that count the same bin first (labeled_partition) was 2.8 times slower on an
// H200 for a normal tensor's top 11 bits, where a few dozen bins take most keys
// (bench/cuda_probe.cu: 1.27 against 0.45 ms at 256 M floats).
__device__ __forceinline__ void count_bin(unsigned* counts, unsigned bin) {
  atomicAdd(&counts[bin], 1u);
}

// The first pass: v = x + e into e_new (error feedback), the non-finite check, and the histogram
// of the top 11 key bits (when `hist` is given).
template <bool EF>
__global__ void first_pass_kernel(const float* __restrict__ x, const float* __restrict__ e_old,
                                  float* __restrict__ e_new, std::size_t n, Keys keys,
                                  unsigned long long* hist, Report* r) {
  __shared__ unsigned counts[kBins];
  if (hist) {
    for (unsigned b = threadIdx.x; b < kBins; b += blockDim.x) counts[b] = 0;
    __syncthreads();
  }
  bool bad = false;
  GCOMP_GRID_ROUNDS(i0, stride, n) {
    float xs[kUnroll];
    float es[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const std::size_t i = i0 + k * stride;
      if (i < n) {
        xs[k] = x[i];
        if (EF) es[k] = e_old[i];
      }
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const std::size_t i = i0 + k * stride;
      if (i >= n) continue;
      float v = xs[k];
      if (EF) {
        v = v + es[k];
        e_new[i] = v;
      }
      bad |= nonfinite(v);
      if (hist) {
        const std::uint32_t key =
            keys.mode == Mode::randomk ? keys(i) : (__float_as_uint(v) & 0x7fffffffu);
        count_bin(counts, key >> 21);
      }
    }
  }
  if (bad) report_nonfinite(r);
  if (hist) {
    __syncthreads();
    for (unsigned b = threadIdx.x; b < kBins; b += blockDim.x) {
      if (counts[b]) atomicAdd(&hist[b], static_cast<unsigned long long>(counts[b]));
    }
  }
}

// Candidates (AIR top-k's filter): the second pass writes aside the indices whose key matches
// the prefix it counts (in no particular order: only histograms read them), so that the third
// histogram reads those instead of the whole tensor. Their number is known from the first
// level's histogram (SelectState::first_bin): when it exceeds the buffer, nothing is written and
// the third pass reads the whole tensor.
template <class Index>
struct Candidates {
  Index* index;
  unsigned long long* count;
  std::size_t capacity;
};

// Histogram of the key bits [shift, shift + width) among the keys that match the prefix above,
// of the elements [0, n) or (`from` given) of the candidates; the matching indices go to `to`
// when it is given and they fit. `whole` marks the whole-tensor launch that stands in for the
// candidates' when they did not fit (each of the two returns when the other one counts).
//
// The candidates gather in a warp's buffer in shared memory and go out a buffer at a time, one
// global atomic each: one atomic per group of lanes on the one counter made the second pass
// (about 0.7% of a normal tensor in the bin, 1.8 M appends at 256 M floats) take 2.1 ms on an
// H200, against 0.25 ms to read the tensor; a block's buffer, with its barriers every round,
// 0.87 ms.
constexpr unsigned kWarpBuffer = 2 * 32 * kUnroll;  // entries: two rounds; flushed past one
//
// With `above` (the second pass, when the candidates fit) it also counts per tile of kTieTile
// the keys above the prefix's bin, which the selection takes whole; then it runs on after an
// early stop (`done`), without the histogram, since the candidates and these counts are what
// the ordered write is sized from.
template <class Index>
__global__ void __launch_bounds__(kThreads)
    hist_kernel(std::size_t n, Keys keys, int shift, int width, const SelectState* st,
                unsigned long long* hist, Candidates<Index> from, Candidates<Index> to,
                unsigned long long* above, bool whole, std::size_t capacity) {
  __shared__ unsigned counts[kBins];
  __shared__ Index buffer[kThreads / 32][kWarpBuffer];
  const bool done = st->done != 0;
  if (done && to.index == nullptr) return;  // these returns are the same for every thread
  const bool fit = st->first_bin <= capacity;
  const bool use_from = from.index != nullptr;
  if (use_from && !fit) return;
  if (whole && fit) return;
  if (use_from) n = static_cast<std::size_t>(*from.count);
  const bool append_to = to.index != nullptr && fit;
  if (done && !append_to) return;
  const bool count_above = append_to && above != nullptr;
  const unsigned bins = 1u << width;
  for (unsigned b = threadIdx.x; b < bins; b += blockDim.x) counts[b] = 0;
  __syncthreads();
  const int hi = shift + width;
  const std::uint32_t prefix = st->prefix;
  const unsigned lane = threadIdx.x & 31u;
  Index* mine = buffer[threadIdx.x / 32];
  unsigned held = 0;  // entries in the warp's buffer (the same in every lane)
  // Writes the warp's buffer out at one global atomic's offset; every lane of the warp calls it.
  const auto flush = [&]() {
    __syncwarp();
    unsigned long long at = 0;
    if (lane == 0) at = atomicAdd(to.count, static_cast<unsigned long long>(held));
    at = __shfl_sync(0xffffffffu, at, 0);
    for (unsigned t = lane; t < held; t += 32) {
      if (at + t < to.capacity) to.index[at + t] = mine[t];
    }
    __syncwarp();
    held = 0;
  };
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  // Rounds as GCOMP_GRID_ROUNDS, the loop's test the same for the whole warp (its ballots).
  const std::size_t block0 = blockIdx.x * static_cast<std::size_t>(blockDim.x);
  for (std::size_t r0 = block0; r0 < n; r0 += kUnroll * stride) {
    const std::size_t j0 = r0 + threadIdx.x;
    std::size_t is[kUnroll];
    std::uint32_t ks[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const std::size_t j = j0 + k * stride;
      if (j < n) is[k] = use_from ? static_cast<std::size_t>(from.index[j]) : j;
    }
    if (keys.mode == Mode::randomk) {
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        if (j0 + k * stride < n) ks[k] = keys(is[k]);
      }
    } else {
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        if (j0 + k * stride < n) ks[k] = keys.abs_key(is[k]);
      }
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const bool match = j0 + k * stride < n && (ks[k] >> hi) == (prefix >> hi);
      if (match && !done) count_bin(counts, (ks[k] >> shift) & (bins - 1));
      if (count_above) {
        // A warp's 32 elements are consecutive and in one tile (rounds and strides are
        // multiples of 256, tiles of 4096).
        const bool up = j0 + k * stride < n && (ks[k] >> hi) > (prefix >> hi);
        const unsigned ups = __ballot_sync(0xffffffffu, up);
        if (lane == 0 && ups != 0) {
          atomicAdd(&above[(j0 + k * stride) / kTieTile], static_cast<unsigned long long>(__popc(ups)));
        }
      }
      if (append_to) {
        const unsigned ballot = __ballot_sync(0xffffffffu, match);
        if (match) mine[held + __popc(ballot & ((1u << lane) - 1u))] = static_cast<Index>(is[k]);
        held += static_cast<unsigned>(__popc(ballot));
      }
    }
    // A round adds at most 32 * kUnroll: flush before the next one could overflow.
    if (append_to && held > kWarpBuffer - 32 * kUnroll) flush();
  }
  if (append_to && held > 0) flush();
  __syncthreads();
  for (unsigned b = threadIdx.x; b < bins; b += blockDim.x) {
    if (counts[b]) atomicAdd(&hist[b], static_cast<unsigned long long>(counts[b]));
  }
}

// The one-block kernels below (the bin of the need-th key, the last tie to take) scan with
// this many threads: a single thread walking 2048 bins, or the tie counts of 65536 tiles, one
// dependent load at a time, cost milliseconds on a GPU.
constexpr unsigned kScanThreads = 1024;
using BlockScanU64 = cub::BlockScan<unsigned long long, kScanThreads>;

// From the highest bin down, the bin that holds the need-th key (walk_stops_at). Clears the
// histogram for the next level. Early stop: when that bin holds exactly the elements still
// needed, every key >= the prefix (its lower bits zero) is taken and the later levels do nothing.
__global__ void __launch_bounds__(kScanThreads)
    pick_bin_kernel(unsigned long long* hist, int shift, int width, bool last, SelectState* st) {
  __shared__ typename BlockScanU64::TempStorage scan;
  if (st->done) return;  // the same for every thread: the block returns together
  const int bins = 1 << width;
  const unsigned long long need = st->need;
  // Thread j holds the bins top = bins - 1 - 2j and top - 1 (none past bin 0).
  const int top = bins - 1 - 2 * static_cast<int>(threadIdx.x);
  const unsigned long long h_top = top >= 0 ? hist[top] : 0;
  const unsigned long long h_next = top >= 1 ? hist[top - 1] : 0;
  unsigned long long above = 0;  // the sum of the bins above `top`
  BlockScanU64(scan).ExclusiveSum(h_top + h_next, above);
  int bin = -1;
  unsigned long long bin_above = 0;
  unsigned long long bin_count = 0;
  if (top >= 0 && walk_stops_at(top, bins, above, h_top, need)) {
    bin = top;
    bin_above = above;
    bin_count = h_top;
  } else if (top >= 1 && walk_stops_at(top - 1, bins, above + h_top, h_next, need)) {
    bin = top - 1;
    bin_above = above + h_top;
    bin_count = h_next;
  }
  if (bin >= 0) {  // exactly one thread
    const unsigned long long left = need - bin_above;
    st->prefix |= static_cast<std::uint32_t>(bin) << shift;
    st->need = left;
    if (shift == 21) st->first_bin = bin_count;
    if (!last && bin_count == left) {
      st->done = 1;
      st->equal = left;  // the tie pass has nothing to do
      st->cut = ~0ull;
    }
    if (last) {
      st->equal = bin_count;
      st->cut = ~0ull;  // every element equal to T is taken, unless the tie pass says otherwise
    }
  }
  __syncthreads();  // every bin has been read
  for (int b = static_cast<int>(threadIdx.x); b < bins; b += kScanThreads) hist[b] = 0;
}

// Per tile of kTieTile, how many of its elements satisfy take(i, key), into out[tile]: a block
// per tile, the blocks striding over the tiles. Every thread of the block calls it.
template <class Take>
__device__ __forceinline__ void count_tiles(std::size_t n, const Keys& keys, const Take& take,
                                            unsigned long long* out) {
  __shared__ unsigned warp_sums[kThreads / 32];
  const std::size_t tiles = (n + kTieTile - 1) / kTieTile;
  for (std::size_t tl = blockIdx.x; tl < tiles; tl += gridDim.x) {
    unsigned c = 0;
    const std::size_t end = (tl + 1) * kTieTile < n ? (tl + 1) * kTieTile : n;
#pragma unroll 8
    for (std::size_t i = tl * kTieTile + threadIdx.x; i < end; i += blockDim.x) {
      c += take(i, keys(i)) ? 1u : 0u;
    }
    for (int o = 16; o >= 1; o /= 2) c += __shfl_down_sync(0xffffffffu, c, o);
    if ((threadIdx.x & 31u) == 0) warp_sums[threadIdx.x / 32] = c;
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned long long total = 0;
      for (unsigned w = 0; w < blockDim.x / 32; ++w) total += warp_sums[w];
      out[tl] = total;
    }
    __syncthreads();
  }
}

// When only some of the elements equal to T are taken and the candidates did not fit (else
// cand_tiles_kernel counts them): their count per tile of kTieTile.
__global__ void tie_count_kernel(std::size_t n, Keys keys, const SelectState* st,
                                 unsigned long long* tiles, std::size_t capacity) {
  if (st->all || st->need == st->equal || st->first_bin <= capacity) return;
  const std::uint32_t t = st->prefix;
  count_tiles(n, keys, [t](std::uint64_t, std::uint32_t key) { return key == t; }, tiles);
}

// One block: the index of the need-th element equal to T. Each thread sums a run of tile
// counts; a scan of the runs finds the run, its thread the tile; then the tile's elements,
// kScanThreads at a time, are ranked among the ties by a scan of their flags.
__global__ void __launch_bounds__(kScanThreads)
    tie_cut_kernel(std::size_t n, Keys keys, const unsigned long long* tiles, SelectState* st) {
  __shared__ typename BlockScanU64::TempStorage scan;
  __shared__ unsigned long long found_tile;
  __shared__ unsigned long long found_left;
  if (st->all || st->need == st->equal) return;  // the same for every thread
  const std::uint32_t t = st->prefix;
  const unsigned long long need = st->need;
  if (threadIdx.x == 0) found_tile = ~0ull;
  __syncthreads();
  const std::size_t count = (n + kTieTile - 1) / kTieTile;
  const std::size_t per = (count + kScanThreads - 1) / kScanThreads;
  const std::size_t lo = threadIdx.x * per < count ? threadIdx.x * per : count;
  const std::size_t hi = lo + per < count ? lo + per : count;
  unsigned long long mine = 0;
  for (std::size_t tl = lo; tl < hi; ++tl) mine += tiles[tl];
  unsigned long long before = 0;
  BlockScanU64(scan).ExclusiveSum(mine, before);
  if (holds_nth(before, mine, need)) {  // exactly one thread
    unsigned long long left = need - before;
    std::size_t tl = lo;
    while (tiles[tl] < left) left -= tiles[tl++];
    found_tile = tl;
    found_left = left;
    st->cut_tile = tl;
    st->cut_rank = left;
  }
  __syncthreads();
  if (found_tile == ~0ull) return;  // fewer ties than needed: cannot happen (cut stays ~0)
  unsigned long long left = found_left;
  const std::size_t start = static_cast<std::size_t>(found_tile) * kTieTile;
  const std::size_t end = start + kTieTile < n ? start + kTieTile : n;
  for (std::size_t base = start; base < end; base += kScanThreads) {
    const std::size_t i = base + threadIdx.x;
    const unsigned long long flag = i < end && keys(i) == t ? 1 : 0;
    unsigned long long rank = 0;
    unsigned long long ties = 0;
    __syncthreads();  // the scan's storage is free again
    BlockScanU64(scan).InclusiveSum(flag, rank, ties);
    if (flag && rank == left) st->cut = i;
    if (ties >= left) return;  // the same for every thread
    left -= ties;
  }
}

struct Pick {
  Keys keys;
  const SelectState* st;
  Mode mode;
  std::uint32_t tau_bits;
  __device__ __forceinline__ bool operator()(std::uint64_t i) const {
    if (mode == Mode::threshold) return keys(i) >= tau_bits;
    if (st->all) return true;
    const std::uint32_t key = keys(i);
    const std::uint32_t t = st->prefix;
    return key > t || (key == t && i <= st->cut);
  }
};

// ---- the ordered write of a ranked selection ----
//
// The selected indices go out in ascending order by tiles of kTieTile: each tile's count of
// selected elements, an exclusive scan of the counts (CUB), then each tile writes its own in
// order. When the candidates fit, the counts come from the second pass (keys above the first
// level's bin) and the candidates (keys above T, and the ties, of which the cut says how many
// count); else one more pass over the tensor counts the predicate.

// Per candidate: its tile gains one selected key (key > T) or one tie (key == T). A warp's
// candidates mostly share a tile (a warp appended them from its own elements), so the lanes of
// one tile add their counts in one atomic each.
template <class Index>
__global__ void cand_tiles_kernel(Candidates<Index> from, Keys keys, const SelectState* st,
                                  std::size_t capacity, unsigned long long* sel,
                                  unsigned long long* ties) {
  if (st->first_bin > capacity) return;
  const std::size_t count = static_cast<std::size_t>(*from.count);
  const std::uint32_t t = st->prefix;
  const unsigned lane = threadIdx.x & 31u;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  // The loop's test is the same for the whole warp (its ballots and matches).
  for (std::size_t w0 = blockIdx.x * static_cast<std::size_t>(blockDim.x) + (threadIdx.x & ~31u);
       w0 < count; w0 += stride) {
    const std::size_t j = w0 + lane;
    const bool valid = j < count;
    const std::size_t i = valid ? static_cast<std::size_t>(from.index[j]) : 0;
    const std::uint32_t key = valid ? keys(i) : 0u;
    const unsigned long long tile = valid ? i / kTieTile : ~0ull;
    const unsigned peers = __match_any_sync(0xffffffffu, tile);
    const unsigned above = __ballot_sync(0xffffffffu, valid && key > t) & peers;
    const unsigned equal = __ballot_sync(0xffffffffu, valid && key == t) & peers;
    if (valid && lane == static_cast<unsigned>(__ffs(peers) - 1)) {
      if (above) atomicAdd(&sel[tile], static_cast<unsigned long long>(__popc(above)));
      if (equal) atomicAdd(&ties[tile], static_cast<unsigned long long>(__popc(equal)));
    }
  }
}

// The candidates fit: each tile's count gains the ties it gives (ties_taken).
__global__ void tile_ties_kernel(std::size_t tiles, const SelectState* st, std::size_t capacity,
                                 const unsigned long long* ties, unsigned long long* sel) {
  if (st->first_bin > capacity) return;
  const unsigned long long cut_tile = st->cut_tile;
  const unsigned long long cut_rank = st->cut_rank;
  GCOMP_GRID_LOOP(t, tiles) sel[t] += ties_taken(t, ties[t], cut_tile, cut_rank);
}

// The predicate of a ranked selection with T and the cut read once.
struct Ranked {
  std::uint32_t t;
  unsigned long long cut;
  __device__ __forceinline__ bool operator()(std::uint64_t i, std::uint32_t key) const {
    return key > t || (key == t && i <= cut);
  }
};

// The candidates did not fit: each tile's count by a pass over its elements.
__global__ void tile_count_kernel(std::size_t n, Keys keys, const SelectState* st,
                                  std::size_t capacity, unsigned long long* sel) {
  if (st->first_bin <= capacity) return;
  count_tiles(n, keys, Ranked{st->prefix, st->cut}, sel);
}

// Each tile writes its selected indices from offsets[tile] on, in ascending order: its
// elements in kTieTile / kThreads rounds of one per thread, a ballot per warp and round, and
// one scan of the (round, warp) counts, which is the tile's index order. Nothing is written past
// k entries: a wrong count shows as a total other than k, which the host reports. With `map`
// (the select ran on a sample's candidates) position i stands for index map[i], and its value
// keys.v[i] goes to vals.
template <class Index>
__global__ void __launch_bounds__(kThreads)
    ordered_write_kernel(std::size_t n, Keys keys, const SelectState* st,
                         const unsigned long long* __restrict__ offsets,
                         const Index* __restrict__ map, Index* __restrict__ idx,
                         float* __restrict__ vals, std::size_t k) {
  constexpr unsigned kRounds = kTieTile / kThreads;
  constexpr unsigned kWarps = kThreads / 32;
  static_assert(kRounds * kWarps == 128, "the scan below takes 4 counts per lane");
  __shared__ unsigned before[kRounds * kWarps];
  const unsigned lane = threadIdx.x & 31u;
  const unsigned warp = threadIdx.x / 32;
  const Ranked take{st->prefix, st->cut};
  const std::size_t tiles = (n + kTieTile - 1) / kTieTile;
  for (std::size_t tl = blockIdx.x; tl < tiles; tl += gridDim.x) {
    const std::size_t base = tl * kTieTile + threadIdx.x;
    std::uint32_t ks[kRounds];
    // A whole tile of top-k keys: no guards, one kind of key (all loads in flight at once).
    if (tl * kTieTile + kTieTile <= n && keys.mode != Mode::randomk) {
#pragma unroll
      for (unsigned r = 0; r < kRounds; ++r) ks[r] = keys.abs_key(base + r * kThreads);
    } else {
#pragma unroll
      for (unsigned r = 0; r < kRounds; ++r) {
        const std::size_t i = base + r * kThreads;
        if (i < n) ks[r] = keys(i);
      }
    }
    unsigned ballots[kRounds];
#pragma unroll
    for (unsigned r = 0; r < kRounds; ++r) {
      const std::size_t i = base + r * kThreads;
      ballots[r] = __ballot_sync(0xffffffffu, i < n && take(i, ks[r]));
      if (lane == 0) before[r * kWarps + warp] = static_cast<unsigned>(__popc(ballots[r]));
    }
    __syncthreads();
    if (warp == 0) {  // exclusive scan of the 128 counts, 4 per lane
      const unsigned c0 = before[4 * lane], c1 = before[4 * lane + 1];
      const unsigned c2 = before[4 * lane + 2], c3 = before[4 * lane + 3];
      const unsigned mine = c0 + c1 + c2 + c3;
      unsigned incl = mine;
      for (int o = 1; o < 32; o *= 2) {
        const unsigned other = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= static_cast<unsigned>(o)) incl += other;
      }
      const unsigned excl = incl - mine;
      before[4 * lane] = excl;
      before[4 * lane + 1] = excl + c0;
      before[4 * lane + 2] = excl + c0 + c1;
      before[4 * lane + 3] = excl + c0 + c1 + c2;
    }
    __syncthreads();
    const unsigned long long out = offsets[tl];
    const unsigned below = (1u << lane) - 1u;
#pragma unroll
    for (unsigned r = 0; r < kRounds; ++r) {
      if ((ballots[r] >> lane) & 1u) {
        const unsigned long long at =
            out + before[r * kWarps + warp] + static_cast<unsigned>(__popc(ballots[r] & below));
        if (at < k) {  // else: a count is off
          const std::size_t i = base + r * kThreads;
          if (map) {
            idx[at] = map[i];
            vals[at] = keys.v[i];
          } else {
            idx[at] = static_cast<Index>(i);
          }
        }
      }
    }
    __syncthreads();  // `before` is the next tile's
  }
}

}  // namespace
}  // namespace gcomp::cuda::detail
