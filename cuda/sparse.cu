// top-k, random-k and threshold on the device (compressors/sparse.cpp, select.hpp): the same
// (index, value) pairs, indices strictly ascending, ties to the lower index.
//
// Selection of the k largest 32-bit keys (top-k: the bits of |v|; random-k: the Philox word of
// the element) is an exact radix select in the style of AIR top-k: three histogram passes over
// 11, 11 and 10 key bits from the top, each followed by a one-block scan from the highest bin
// that fixes the bits of the k-th key T and how many elements equal to T are still needed
// (`ties`); when the chosen bin holds exactly the elements still needed, the select stops early
// (every key from that prefix up is taken). As AIR top-k's filter, the second pass writes the
// indices in the first level's bin aside (the candidates) and the third histogram reads only
// those. When fewer than all the elements equal to T are needed, the index of the last one to
// take (`cut`) makes the selection the pure predicate key > T || (key == T && i <= cut).
//
// The selected indices go out in ascending order by tiles of 4096: each tile's count, a scan
// of the counts, and each tile's ordered write (ordered_write_kernel). The counts come without
// another pass over the tensor: the second pass counts per tile the keys above the first
// level's bin (all taken), the candidates add per tile the keys above T and the ties (every
// tie is a candidate), and the cut says how many of a tile's ties are taken (ties_taken,
// radix_select.hpp). When the candidates outgrow their buffer, the third histogram, the tie
// counts and the tile counts each read the whole tensor instead.
//
// Top-k of a large tensor (n >= 2^20, k <= n / 8) starts from a sample instead: the keys of
// m <= 2^18 evenly spread elements give, by two levels of the same radix select, a threshold
// that the k-th key is above with high probability (sample_rank, radix_select.hpp). One pass over
// the tensor (with error feedback v = x + e, and the non-finite check) writes aside the elements
// whose key is at or above it, about 1.1 k of them, each warp its own stretch in order (so a scan
// of the warps' totals puts them in ascending order without a sort); their number comes back to
// the host. When it is at least k (and fits), the exact select above runs on those candidates'
// values instead of the tensor: ascending candidates keep the ties' index order, so the
// selection is the same; its ordered write maps positions back to indices and keeps the values
// for the emit. Otherwise (the sample misled: its threshold was above the k-th key, or too many
// keys equal it) the select reads the whole tensor. The tensor is read once instead of three
// times.
//
// The indices are then packed as gaps in blocks of 128 (the payload's version 2,
// compressors/index_pack.hpp): a warp per block finds its width, a scan places the blocks, a
// warp per block writes its bytes; a last kernel writes the values and, with error
// feedback, v - sent at the sent entries (the first pass has left v in e_new everywhere).
// Decoding a version 2 payload unpacks and checks its indices on the host (the CPU's code and
// messages) and hands them to the version 1 kernels.
//
// Threshold (and top-k or random-k with k >= n) is a predicate alone (|v| >= tau), compacted by
// CUB's DeviceSelect::If; threshold's count comes back to the host for the header.
#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>
#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>

#include <algorithm>
#include <cfloat>
#include <string>

#include "bytes.hpp"
#include "codecs.cuh"
#include "index_pack.hpp"
#include "half_bits.hpp"
#include "index_pack.cuh"
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

// ---- packing the indices: index_pack.cuh ----

// The values of the selected entries (and, index_bytes 4 or 8, their indices as in version 1;
// 0: none); with error feedback ef[i] = v[i] - sent. The values come from `vals` in entry order
// where the select wrote them, else from v.
template <class Index>
__global__ void emit_kernel(const Index* __restrict__ idx, const unsigned long long* count_dev,
                            std::size_t count_host, const float* v, const float* vals, float* ef,
                            int index_bytes, bool fp16, float mul, unsigned char* __restrict__ ip,
                            unsigned char* __restrict__ vp) {
  const std::size_t count = count_dev ? static_cast<std::size_t>(*count_dev) : count_host;
  GCOMP_GRID_LOOP(j, count) {
    const std::uint64_t i = idx[j];
    if (index_bytes == 4) {
      store_u32(ip + 4 * j, static_cast<std::uint32_t>(i));
    } else if (index_bytes == 8) {
      store_u32(ip + 8 * j, static_cast<std::uint32_t>(i));
      store_u32(ip + 8 * j + 4, static_cast<std::uint32_t>(i >> 32));
    }
    const float x = vals ? vals[j] : v[i];
    float val = x;
    if (mul != 1.0f) {
      val = val * mul;
      if (nonfinite(val)) val = copysignf(FLT_MAX, x);  // saturate, never Inf
    }
    float sent = val;
    if (fp16) {
      const std::uint32_t h = half_bits_of(val);  // stored a byte at a time: half_bits.hpp
      store_u16(vp + 2 * j, h);
      sent = from_half(h);
    } else {
      store_u32(vp + 4 * j, __float_as_uint(val));
    }
    if (ef) ef[i] = x - sent;
  }
}

// ---- decode ----

template <bool Wide>
__global__ void sparse_validate_kernel(const unsigned char* __restrict__ ip,
                                       const unsigned char* __restrict__ vp, std::size_t nnz,
                                       std::uint64_t n, bool fp16, Report* r) {
  GCOMP_GRID_LOOP(j, nnz) {
    const std::uint64_t i = Wide ? (static_cast<std::uint64_t>(load_u32(ip + 8 * j)) |
                                    (static_cast<std::uint64_t>(load_u32(ip + 8 * j + 4)) << 32))
                                 : load_u32(ip + 4 * j);
    bool bad = i >= n;
    if (j > 0) {
      const std::uint64_t prev =
          Wide ? (static_cast<std::uint64_t>(load_u32(ip + 8 * (j - 1))) |
                  (static_cast<std::uint64_t>(load_u32(ip + 8 * (j - 1) + 4)) << 32))
               : load_u32(ip + 4 * (j - 1));
      bad |= i <= prev;
    }
    if (bad) report_bad(r, 0, j);
    const bool finite = fp16 ? (load_u16(vp + 2 * j) & 0x7c00u) != 0x7c00u
                             : (load_u32(vp + 4 * j) & kInfBits) != kInfBits;
    if (!finite) report_bad_second(r, 1, j);
  }
}

template <bool Wide>
__global__ void sparse_decode_kernel(const unsigned char* __restrict__ ip,
                                     const unsigned char* __restrict__ vp, std::size_t nnz,
                                     bool fp16, float alpha, float* __restrict__ acc,
                                     const Report* r) {
  if (r->code != 0) return;
  GCOMP_GRID_LOOP(j, nnz) {
    const std::uint64_t i = Wide ? (static_cast<std::uint64_t>(load_u32(ip + 8 * j)) |
                                    (static_cast<std::uint64_t>(load_u32(ip + 8 * j + 4)) << 32))
                                 : load_u32(ip + 4 * j);
    const float v = fp16 ? from_half(load_u16(vp + 2 * j)) : __uint_as_float(load_u32(vp + 4 * j));
    acc[i] += alpha * v;  // indices are distinct (validated strictly increasing)
  }
}

// The first pass's grid: resident when it counts a histogram (each block flushes its shared
// histogram once; 65535 blocks flushing theirs cost more than the counting), else one element
// per thread and round.
template <class Kernel>
unsigned first_grid(Kernel kernel, std::size_t n, bool hist) {
  return hist ? resident_grid(kernel, grid_for_rounds(n)) : grid_for_rounds(n);
}

Mode mode_of(CodecKind k) {
  return k == CodecKind::topk ? Mode::topk
                              : (k == CodecKind::randomk ? Mode::randomk : Mode::threshold);
}

template <class Index>
std::size_t encode_sparse_as(const EncodeCall& c) {
  const CodecKind kind = c.codec->kind();
  const Mode mode = mode_of(kind);
  const gcomp::detail::CodecParams cp = c.codec->params();
  const std::size_t n = c.n;
  const std::size_t k = mode == Mode::threshold ? n : c.codec->selected(n);
  if (mode != Mode::threshold) gcomp::detail::require_capacity(c.codec->max_bytes(n), c.cap);
  const cudaStream_t s = c.ws->stream();
  const float* v = c.e_old ? c.e_new : c.x;
  Keys keys{v, mode, static_cast<std::uint32_t>(c.seed), static_cast<std::uint32_t>(c.seed >> 32),
            static_cast<std::uint32_t>(kind)};
  const std::uint32_t tau_bits =
      mode == Mode::threshold ? gcomp::detail::float_bits(static_cast<float>(cp.tau)) : 0;

  // Two-phase sizing of the workspace (CUB's temporary storage included).
  const bool ranked = mode != Mode::threshold && k < n;
  SelectState* st = nullptr;
  Pick pick{keys, st, mode, tau_bits};
  std::size_t cub_bytes = 0;
  if (!ranked) {
    GCOMP_CUDA(cub::DeviceSelect::If(nullptr, cub_bytes, thrust::counting_iterator<Index>(0),
                                     static_cast<Index*>(nullptr),
                                     static_cast<unsigned long long*>(nullptr),
                                     static_cast<std::int64_t>(n), pick, s));
  }
  const std::size_t tiles = (n + kTieTile - 1) / kTieTile;
  // A ranked selection's tile counts (one more, 0, so that the scan's last entry is the total)
  // and their offsets.
  const std::size_t tile_slots = ranked ? tiles + 1 : 0;
  std::size_t tile_scan_bytes = 0;
  if (ranked) {
    GCOMP_CUDA(cub::DeviceScan::ExclusiveSum(nullptr, tile_scan_bytes,
                                             static_cast<unsigned long long*>(nullptr),
                                             static_cast<unsigned long long*>(nullptr),
                                             static_cast<std::int64_t>(tile_slots), s));
  }
  Carve size;
  size.take<unsigned long long>(kBins);
  size.take<SelectState>(1);
  size.take<unsigned long long>(tiles);
  size.take<Index>(k);
  size.take<unsigned long long>(1);
  size.take<unsigned char>(cub_bytes);
  // Room for candidates: a sixteenth of the tensor (at least 2^20) covers a bin of the k-th key
  // unless the keys crowd into very few bins; past it the third pass reads the whole tensor.
  const std::size_t cand_capacity =
      ranked ? std::min(n, std::max(n / 16, std::size_t{1} << 20)) : 0;
  size.take<Index>(cand_capacity);
  size.take<unsigned long long>(1);
  size.take<unsigned long long>(tile_slots);
  size.take<unsigned long long>(tile_slots);
  size.take<unsigned char>(tile_scan_bytes);
  // The packing: per block of 128 indices a width, its bytes and its offset (a CUB scan).
  const std::size_t max_blocks = std::max<std::size_t>(1, (k + kBlock - 1) / kBlock);
  std::size_t scan_bytes = 0;
  GCOMP_CUDA(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes,
                                           static_cast<unsigned long long*>(nullptr),
                                           static_cast<unsigned long long*>(nullptr),
                                           static_cast<int>(max_blocks), s));
  size.take<unsigned char>(max_blocks);
  size.take<unsigned long long>(max_blocks);
  size.take<unsigned long long>(max_blocks);
  size.take<unsigned char>(scan_bytes);
  // Top-k from a sample: the sample's keys, its histogram and select state; the filter's
  // candidates (room for twice k and 2^16, against the 1.1 k expected), its flushes and warps'
  // totals, their scan; the candidates in order; the selected values.
  const std::size_t sample = std::min(kSampleMax, n / 8);
  const std::size_t rank = mode == Mode::topk && ranked && n >= kSampleMin
                               ? sample_rank(k, n, sample) : 0;
  const bool sampled = rank > 0 && k <= n / 8;
  const std::size_t sample_capacity = sampled ? std::min(n, 2 * k + (std::size_t{1} << 16)) : 0;
  constexpr std::size_t kRound = 32 * kFilterUnroll;
  unsigned filter_blocks = 0;
  std::size_t filter_warps = 0;
  std::size_t chunk = 0;
  std::size_t flush_capacity = 0;
  std::size_t warp_scan_bytes = 0;
  if (sampled) {
    filter_blocks = c.e_old ? resident_grid(filter_kernel<true, Index>, grid_for(n, kThreads * kFilterUnroll))
                            : resident_grid(filter_kernel<false, Index>, grid_for(n, kThreads * kFilterUnroll));
    filter_warps = static_cast<std::size_t>(filter_blocks) * (kThreads / 32);
    chunk = ((n + filter_warps - 1) / filter_warps + kRound - 1) / kRound * kRound;
    // A flush other than a warp's last moves more than kFilterBuffer - kRound entries.
    flush_capacity = filter_warps + sample_capacity / (kFilterBuffer - kRound) + 1;
    GCOMP_CUDA(cub::DeviceScan::ExclusiveSum(nullptr, warp_scan_bytes,
                                             static_cast<unsigned long long*>(nullptr),
                                             static_cast<unsigned long long*>(nullptr),
                                             static_cast<std::int64_t>(filter_warps), s));
  }
  size.take<std::uint32_t>(sample);
  size.take<unsigned long long>(sampled ? kBins : 0);
  size.take<SelectState>(sampled ? 1 : 0);
  size.take<Index>(sample_capacity);
  size.take<float>(sample_capacity);
  size.take<unsigned long long>(sampled ? 2 : 0);
  size.take<Flush>(flush_capacity);
  size.take<unsigned long long>(filter_warps);
  size.take<unsigned long long>(filter_warps);
  size.take<unsigned char>(warp_scan_bytes);
  size.take<Index>(sample_capacity);
  size.take<float>(sample_capacity);
  size.take<float>(sampled ? k : 0);
  Carve carve(c.ws->reserve(size.bytes()));
  unsigned long long* hist = carve.take<unsigned long long>(kBins);
  st = carve.take<SelectState>(1);
  unsigned long long* tile_ties = carve.take<unsigned long long>(tiles);
  Index* idx = carve.take<Index>(k);
  unsigned long long* selected = carve.take<unsigned long long>(1);
  void* cub_temp = carve.take<unsigned char>(cub_bytes);
  Index* cand_index = carve.take<Index>(cand_capacity);
  unsigned long long* cand_count = carve.take<unsigned long long>(1);
  unsigned long long* tile_sel = carve.take<unsigned long long>(tile_slots);
  unsigned long long* tile_offsets = carve.take<unsigned long long>(tile_slots);
  void* tile_scan_temp = carve.take<unsigned char>(tile_scan_bytes);
  unsigned char* widths = carve.take<unsigned char>(max_blocks);
  unsigned long long* block_bytes = carve.take<unsigned long long>(max_blocks);
  unsigned long long* block_offsets = carve.take<unsigned long long>(max_blocks);
  void* scan_temp = carve.take<unsigned char>(scan_bytes);
  std::uint32_t* sample_keys = carve.take<std::uint32_t>(sample);
  unsigned long long* sample_hist = carve.take<unsigned long long>(sampled ? kBins : 0);
  SelectState* sample_st = carve.take<SelectState>(sampled ? 1 : 0);
  Index* filtered_index = carve.take<Index>(sample_capacity);
  float* filtered_value = carve.take<float>(sample_capacity);
  unsigned long long* filtered_counts = carve.take<unsigned long long>(sampled ? 2 : 0);
  Flush* flushes = carve.take<Flush>(flush_capacity);
  unsigned long long* warp_totals = carve.take<unsigned long long>(filter_warps);
  unsigned long long* warp_offsets = carve.take<unsigned long long>(filter_warps);
  void* warp_scan_temp = carve.take<unsigned char>(warp_scan_bytes);
  Index* ordered_index = carve.take<Index>(sample_capacity);
  float* ordered_value = carve.take<float>(sample_capacity);
  float* selected_values = carve.take<float>(sampled ? k : 0);
  pick.st = st;

  Stages stages(s, "encode", codec_name(kind), n);
  c.ws->reset_report();
  SelectState init{};
  init.need = k;
  init.all = mode != Mode::threshold && k >= n ? 1u : 0u;
  init.cut = ~0ull;
  init.cut_tile = ~0ull;
  GCOMP_CUDA(cudaMemcpyAsync(st, &init, sizeof init, cudaMemcpyHostToDevice, s));
  GCOMP_CUDA(cudaMemsetAsync(hist, 0, kBins * sizeof(unsigned long long), s));

  // The exact select of the k largest keys of nr elements (the tensor, or a sample's candidates,
  // whose indices `map` holds in ascending order), from their first level's histogram in `hist`:
  // the selected indices into idx, ascending. Returns where the selected count lands.
  const auto select_ranked = [&](std::size_t nr, const Keys& kr, const Index* map, float* vals) {
    const std::size_t tr = (nr + kTieTile - 1) / kTieTile;
    const std::size_t slots = tr + 1;
    // The second level's candidates: never more than nr.
    const std::size_t cap = std::min(cand_capacity, nr);
    const Candidates<Index> none{nullptr, nullptr, 0};
    const Candidates<Index> cand{cand_index, cand_count, cap};
    GCOMP_CUDA(cudaMemsetAsync(cand_count, 0, sizeof *cand_count, s));
    GCOMP_CUDA(cudaMemsetAsync(tile_ties, 0, tr * sizeof(unsigned long long), s));
    GCOMP_CUDA(cudaMemsetAsync(tile_sel, 0, slots * sizeof(unsigned long long), s));
    pick_bin_kernel<<<1, kScanThreads, 0, s>>>(hist, 21, 11, false, st);
    stages.mark("pick1");
    const unsigned hist_grid = resident_grid(hist_kernel<Index>, grid_for_rounds(nr));
    hist_kernel<Index><<<hist_grid, kThreads, 0, s>>>(nr, kr, 10, 11, st, hist, none, cand,
                                                      tile_sel, false, cap);
    stages.mark("hist2");
    pick_bin_kernel<<<1, kScanThreads, 0, s>>>(hist, 10, 11, false, st);
    stages.mark("pick2");
    // The third histogram from the candidates, or (when they did not fit) from all nr.
    hist_kernel<Index><<<resident_grid(hist_kernel<Index>, grid_for_rounds(cap)),
                         kThreads, 0, s>>>(nr, kr, 0, 10, st, hist, cand, none, nullptr, false,
                                           cap);
    hist_kernel<Index><<<hist_grid, kThreads, 0, s>>>(nr, kr, 0, 10, st, hist, none, none,
                                                      nullptr, true, cap);
    stages.mark("hist3");
    pick_bin_kernel<<<1, kScanThreads, 0, s>>>(hist, 0, 10, true, st);
    stages.mark("pick3");
    // The ties per tile (from the candidates, or from all nr when they did not fit), the cut.
    cand_tiles_kernel<Index><<<resident_grid(cand_tiles_kernel<Index>, grid_for(cap)), kThreads,
                               0, s>>>(cand, kr, st, cap, tile_sel, tile_ties);
    tie_count_kernel<<<grid_for(tr, 1), kThreads, 0, s>>>(nr, kr, st, tile_ties, cap);
    stages.mark("tie_count");
    tie_cut_kernel<<<1, kScanThreads, 0, s>>>(nr, kr, tile_ties, st);
    stages.mark("tie_cut");
    // Each tile's selected count, their offsets, the ordered write.
    tile_ties_kernel<<<grid_for(tr), kThreads, 0, s>>>(tr, st, cap, tile_ties,
                                                       tile_sel);
    tile_count_kernel<<<grid_for(tr, 1), kThreads, 0, s>>>(nr, kr, st, cap, tile_sel);
    GCOMP_CUDA(cub::DeviceScan::ExclusiveSum(tile_scan_temp, tile_scan_bytes, tile_sel,
                                             tile_offsets, static_cast<std::int64_t>(slots), s));
    stages.mark("tile_counts");
    ordered_write_kernel<Index><<<grid_for(tr, 1), kThreads, 0, s>>>(nr, kr, st, tile_offsets,
                                                                      map, idx, vals, k);
    GCOMP_LAUNCHED("radix select");
    stages.mark("select");
    return tile_offsets + tr;
  };

  const unsigned long long* count_at = selected;
  bool sampled_done = false;
  if (sampled) {
    // The threshold: the sample's rank-th largest key to its top 22 bits (two levels of the
    // radix select on the sample, its own state).
    SelectState sinit{};
    sinit.need = rank;
    sinit.cut = ~0ull;
    sinit.cut_tile = ~0ull;
    GCOMP_CUDA(cudaMemcpyAsync(sample_st, &sinit, sizeof sinit, cudaMemcpyHostToDevice, s));
    GCOMP_CUDA(cudaMemsetAsync(sample_hist, 0, kBins * sizeof(unsigned long long), s));
    GCOMP_CUDA(cudaMemsetAsync(filtered_counts, 0, 2 * sizeof(unsigned long long), s));
    sample_kernel<<<grid_for(sample), kThreads, 0, s>>>(c.x, c.e_old, n, sample, sample_keys,
                                                       sample_hist);
    pick_bin_kernel<<<1, kScanThreads, 0, s>>>(sample_hist, 21, 11, false, sample_st);
    const Candidates<Index> none{nullptr, nullptr, 0};
    const Keys sk{reinterpret_cast<const float*>(sample_keys), Mode::topk, 0, 0, 0};
    hist_kernel<Index><<<resident_grid(hist_kernel<Index>, grid_for_rounds(sample)), kThreads, 0,
                         s>>>(sample, sk, 10, 11, sample_st, sample_hist, none, none, nullptr,
                              false, sample);
    pick_bin_kernel<<<1, kScanThreads, 0, s>>>(sample_hist, 10, 11, false, sample_st);
    GCOMP_LAUNCHED("top-k sample");
    stages.mark("sample");
    const Filtered<Index> to{filtered_index, filtered_value, filtered_counts, sample_capacity,
                             flushes, filtered_counts + 1, flush_capacity, warp_totals};
    const std::uint32_t* threshold = &sample_st->prefix;
    if (c.e_old) {
      filter_kernel<true, Index><<<filter_blocks, kThreads, 0, s>>>(
          c.x, c.e_old, c.e_new, n, chunk, threshold, to, c.ws->report());
    } else {
      filter_kernel<false, Index><<<filter_blocks, kThreads, 0, s>>>(
          c.x, nullptr, nullptr, n, chunk, threshold, to, c.ws->report());
    }
    GCOMP_LAUNCHED("top-k filter");
    stages.mark("filter");
    unsigned long long found = 0;
    GCOMP_CUDA(cudaMemcpyAsync(&found, filtered_counts, sizeof found, cudaMemcpyDeviceToHost, s));
    if (c.ws->finish().code == kNonfinite) throw_nonfinite(c.x, c.e_old, n, *c.ws);
    stages.mark("filter_count");
    if (found >= k && found <= sample_capacity) {
      const std::size_t nc = static_cast<std::size_t>(found);
      GCOMP_CUDA(cub::DeviceScan::ExclusiveSum(warp_scan_temp, warp_scan_bytes, warp_totals,
                                               warp_offsets,
                                               static_cast<std::int64_t>(filter_warps), s));
      order_kernel<Index><<<grid_for(flush_capacity, kThreads / 32), kThreads, 0, s>>>(
          to, warp_offsets, ordered_index, ordered_value);
      GCOMP_LAUNCHED("top-k candidates");
      stages.mark("order");
      const Keys ck{ordered_value, Mode::topk, 0, 0, 0};
      first_pass_kernel<false>
          <<<first_grid(first_pass_kernel<false>, nc, true), kThreads, 0, s>>>(
              ordered_value, nullptr, nullptr, nc, ck, hist, c.ws->report());
      GCOMP_LAUNCHED("top-k candidates' histogram");
      stages.mark("first_pass");
      count_at = select_ranked(nc, ck, ordered_index, selected_values);
      sampled_done = true;
    } else {
      // The sample's threshold missed: the select reads the tensor (v, written by the filter).
      first_pass_kernel<false><<<first_grid(first_pass_kernel<false>, n, true), kThreads, 0, s>>>(
          v, nullptr, nullptr, n, keys, hist, c.ws->report());
      GCOMP_LAUNCHED("sparse first pass");
      stages.mark("first_pass");
    }
  } else if (n > 0) {
    if (c.e_old) {
      first_pass_kernel<true><<<first_grid(first_pass_kernel<true>, n, ranked), kThreads, 0, s>>>(
          c.x, c.e_old, c.e_new, n, keys, ranked ? hist : nullptr, c.ws->report());
    } else {
      first_pass_kernel<false><<<first_grid(first_pass_kernel<false>, n, ranked), kThreads, 0, s>>>(
          c.x, nullptr, nullptr, n, keys, ranked ? hist : nullptr, c.ws->report());
    }
    GCOMP_LAUNCHED("sparse first pass");
    stages.mark("first_pass");
  }
  if (ranked && !sampled_done) {
    count_at = select_ranked(n, keys, nullptr, nullptr);
  } else if (!ranked && n > 0) {
    GCOMP_CUDA(cub::DeviceSelect::If(cub_temp, cub_bytes, thrust::counting_iterator<Index>(0), idx,
                                     selected, static_cast<std::int64_t>(n), pick, s));
    stages.mark("select");
  }
  // The selected count comes back: threshold's sizes the header, so it comes before the widths;
  // top-k's and random-k's must be k (the select is exact), which is checked with the packed
  // size below, one wait for both.
  unsigned long long got = 0;
  if (n > 0) {
    GCOMP_CUDA(cudaMemcpyAsync(&got, count_at, sizeof got, cudaMemcpyDeviceToHost, s));
  }
  std::size_t nnz = k;
  if (!ranked) {
    if (c.ws->finish().code == kNonfinite) throw_nonfinite(c.x, c.e_old, n, *c.ws);
    if (mode == Mode::threshold) nnz = static_cast<std::size_t>(got);
  }
  stages.mark("count_back");

  // The packed indices' size: each block's width and bytes, their offsets, the total.
  const std::size_t blocks = (nnz + kBlock - 1) / kBlock;
  unsigned long long last[2] = {0, 0};
  if (blocks > 0) {
    block_width_kernel<Index><<<grid_for(blocks, kThreads / 32), kThreads, 0, s>>>(idx, nnz, widths,
                                                                              block_bytes);
    GCOMP_CUDA(cub::DeviceScan::ExclusiveSum(scan_temp, scan_bytes, block_bytes, block_offsets,
                                             static_cast<int>(blocks), s));
    GCOMP_LAUNCHED("sparse index widths");
    GCOMP_CUDA(cudaMemcpyAsync(&last[0], block_offsets + blocks - 1, sizeof last[0],
                               cudaMemcpyDeviceToHost, s));
    GCOMP_CUDA(cudaMemcpyAsync(&last[1], block_bytes + blocks - 1, sizeof last[1],
                               cudaMemcpyDeviceToHost, s));
  }
  if (ranked) {
    if (c.ws->finish().code == kNonfinite) throw_nonfinite(c.x, c.e_old, n, *c.ws);
    if (n > 0 && got != k) {
      throw Error(Status::internal, "CUDA top-k select kept " + std::to_string(got) +
                                        " entries instead of " + std::to_string(k));
    }
  } else if (blocks > 0) {
    GCOMP_CUDA(cudaStreamSynchronize(s));
  }
  const std::size_t packed = blocks > 0 ? static_cast<std::size_t>(last[0] + last[1]) : 0;
  stages.mark("widths");
  const std::size_t vb = cp.fp16_values ? 2 : 4;
  const std::size_t head_bytes = gcomp::detail::header_bytes(gcomp::detail::Layout{16, 2});
  const std::size_t need = head_bytes + packed + nnz * vb;
  // The CPU's check: room for the indices' worst packing (for top-k and random-k, max_bytes
  // above), so that a buffer serves on both or on neither.
  gcomp::detail::require_capacity(
      head_bytes + gcomp::detail::packed_indices_bound(nnz, n) + nnz * vb, c.cap);
  std::byte params[16] = {};
  params[0] = std::byte{static_cast<unsigned char>(cp.fp16_values ? 1 : 0)};
  params[1] = std::byte{0};  // packed gaps
  gcomp::detail::store_le<std::uint64_t>(params + 8, nnz);
  std::byte head[gcomp::detail::kMaxHeaderBytes];
  const std::byte* end = gcomp::detail::write_header(head, kind, n, params, {packed, nnz * vb});
  unsigned char* ip = put_header(c, reinterpret_cast<const unsigned char*>(head),
                                 static_cast<std::size_t>(end - head));
  const float mul = (mode == Mode::randomk && cp.scale && nnz > 0)
                        ? static_cast<float>(static_cast<double>(n) / static_cast<double>(nnz))
                        : 1.0f;
  if (nnz > 0) {
    pack_kernel<Index><<<grid_for(blocks, kThreads / 32), kThreads, 0, s>>>(idx, nnz, widths,
                                                                           block_offsets, ip);
    stages.mark("pack");
    emit_kernel<Index><<<grid_for(nnz), kThreads, 0, s>>>(
        idx, nullptr, nnz, v, sampled_done ? selected_values : nullptr,
        c.e_old ? c.e_new : nullptr, 0, cp.fp16_values, mul, nullptr, ip + packed);
    GCOMP_LAUNCHED("sparse emit");
    stages.mark("emit");
  }
  c.ws->finish();
  stages.mark("finish");
  return need;
}

std::size_t encode_sparse(const EncodeCall& c) {
  // Indices fit 32 bits up to n = 2^32 (the largest index is n - 1).
  if (gcomp::detail::index_width(c.n) == 4) return encode_sparse_as<std::uint32_t>(c);
  return encode_sparse_as<std::uint64_t>(c);
}

void decode_sparse(const DecodeCall& d) {
  // As on the CPU (validate_decode_add_sparse): past the layout, a wrong accumulator size is
  // reported before anything in the sections.
  if (!d.apply) check_size(d);
  const std::uint64_t n = d.p.n;
  const bool fp16 = static_cast<std::uint8_t>(d.p.params[0]) == 1;
  const std::size_t nnz = gcomp::detail::load_le<std::uint64_t>(d.p.params + 8);
  const unsigned char* ip = d.sections[0];
  bool wide = static_cast<std::uint8_t>(d.p.params[1]) == 8;
  // Version 2: the packed indices come to the host, are unpacked and checked by the CPU's code
  // (its messages), and go back to the device as version 1's 4- or 8-byte indices.
  std::vector<unsigned char> flat;
  Stages stages(d.ws->stream(), "decode_add", codec_name(d.p.kind), n);
  if (d.p.version >= 2) {
    std::vector<std::byte> packed(static_cast<std::size_t>(d.p.sections[0].size));
    if (!packed.empty()) {
      GCOMP_CUDA(cudaMemcpyAsync(packed.data(), ip, packed.size(), cudaMemcpyDeviceToHost,
                                 d.ws->stream()));
      GCOMP_CUDA(cudaStreamSynchronize(d.ws->stream()));
    }
    stages.mark("to_host");
    std::vector<std::uint64_t> idx(nnz);
    try {
      gcomp::detail::unpack_indices(packed, nnz, n, idx.data());
    } catch (const Error& e) {
      gcomp::detail::bad_payload(e.what());
    }
    wide = gcomp::detail::index_width(n) == 8;
    const std::size_t ib = wide ? 8 : 4;
    flat.resize(nnz * ib);
    for (std::size_t j = 0; j < nnz; ++j) {
      for (std::size_t b = 0; b < ib; ++b) {
        flat[j * ib + b] = static_cast<unsigned char>(idx[j] >> (8 * b));
      }
    }
    stages.mark("unpack_on_host");
    auto* dev = static_cast<unsigned char*>(d.ws->reserve(std::max<std::size_t>(1, flat.size())));
    if (!flat.empty()) {
      GCOMP_CUDA(cudaMemcpyAsync(dev, flat.data(), flat.size(), cudaMemcpyHostToDevice,
                                 d.ws->stream()));
    }
    stages.mark("to_device");
    ip = dev;
  }
  const unsigned char* vp = d.sections[1];
  const cudaStream_t s = d.ws->stream();
  d.ws->reset_report();
  if (nnz > 0) {
    if (wide) {
      sparse_validate_kernel<true><<<grid_for(nnz), kThreads, 0, s>>>(ip, vp, nnz, n, fp16,
                                                                      d.ws->report());
      if (d.apply) {
        sparse_decode_kernel<true><<<grid_for(nnz), kThreads, 0, s>>>(ip, vp, nnz, fp16, d.alpha,
                                                                      d.acc, d.ws->report());
      }
    } else {
      sparse_validate_kernel<false><<<grid_for(nnz), kThreads, 0, s>>>(ip, vp, nnz, n, fp16,
                                                                       d.ws->report());
      if (d.apply) {
        sparse_decode_kernel<false><<<grid_for(nnz), kThreads, 0, s>>>(ip, vp, nnz, fp16,
                                                                       d.alpha, d.acc,
                                                                       d.ws->report());
      }
    }
    GCOMP_LAUNCHED("sparse decode_add");
    stages.mark("validate_add");
  }
  const Report& r = d.ws->finish();
  stages.mark("finish");
  if (r.code != kBadPayload) return check_size(d);
  if (r.what & 1u) {
    // The first bad entry, named as the CPU names it.
    const std::size_t j = r.first;
    const std::size_t ib = wide ? 8 : 4;
    std::uint64_t pair[2] = {0, 0};  // prev, i
    unsigned char buf[16] = {};
    const std::size_t from = j > 0 ? j - 1 : 0;
    GCOMP_CUDA(cudaMemcpy(buf, ip + from * ib, (j - from + 1) * ib, cudaMemcpyDeviceToHost));
    for (std::size_t q = 0; q <= j - from; ++q) {
      std::uint64_t val = 0;
      for (std::size_t b = 0; b < ib; ++b) val |= static_cast<std::uint64_t>(buf[q * ib + b]) << (8 * b);
      pair[j > 0 ? q : 1] = val;
    }
    if (pair[1] >= n) {
      gcomp::detail::bad_payload("index " + std::to_string(pair[1]) + " (entry " +
                                 std::to_string(j) + ") is out of range for " +
                                 std::to_string(n) + " elements");
    }
    gcomp::detail::bad_payload("indices not strictly increasing at entry " + std::to_string(j) +
                               " (" + std::to_string(pair[0]) + " then " +
                               std::to_string(pair[1]) + ")");
  }
  gcomp::detail::bad_payload("value of entry " + std::to_string(r.second) + " is NaN or Inf");
}

}  // namespace

std::span<const DeviceCodec> sparse_device_codecs() {
  static const DeviceCodec list[] = {{CodecKind::topk, encode_sparse, decode_sparse},
                                     {CodecKind::randomk, encode_sparse, decode_sparse},
                                     {CodecKind::threshold, encode_sparse, decode_sparse}};
  return list;
}

}  // namespace gcomp::cuda::detail
