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
// Decoding is sparse_decode.cu.
//
// Threshold (and top-k or random-k with k >= n) is a predicate alone (|v| >= tau), compacted by//
// This file: the encode as a driver of named stages (SparseEncode: plan, carve, start, sample
// and filter, first pass, select, count back, widths, write), the emit, and the codecs' list.
// The select's kernels are sparse_select.cuh's, the sample's sparse_sample.cuh's.
#include <cub/device/device_scan.cuh>
#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>

#include <algorithm>
#include <optional>
#include <string>

#include "bytes.hpp"
#include "codecs.cuh"
#include "half_bits.hpp"
#include "index_pack.cuh"
#include "index_pack.hpp"
#include "sparse_sample.cuh"
#include "sparse_select.cuh"

namespace gcomp::cuda::detail {

namespace {

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

// What an encode's workspace holds, sized before anything runs (CUB's temporary storage
// included).
struct EncodePlan {
  Mode mode;
  std::size_t n = 0;
  std::size_t k = 0;
  bool ranked = false;  // a select of k < n (top-k, random-k), else a predicate alone
  std::size_t tiles = 0;
  // A ranked selection's tile counts (one more, 0, so that the scan's last entry is the total)
  // and their offsets.
  std::size_t tile_slots = 0;
  std::size_t cub_bytes = 0;  // DeviceSelect::If's, for the predicate
  std::size_t tile_scan_bytes = 0;
  // Room for candidates: a sixteenth of the tensor (at least 2^20) covers a bin of the k-th key
  // unless the keys crowd into very few bins; past it the third pass reads the whole tensor.
  std::size_t cand_capacity = 0;
  // The packing: per block of 128 indices a width, its bytes and its offset (a CUB scan).
  std::size_t max_blocks = 0;
  std::size_t scan_bytes = 0;
  // Top-k from a sample: the sample's size and the rank of its threshold; the filter's
  // candidates (room for twice k and 2^16, against the 1.1 k expected), its blocks, warps,
  // each warp's stretch, its flushes, the scan of the warps' totals.
  std::size_t sample = 0;
  std::size_t rank = 0;
  bool sampled = false;
  std::size_t sample_capacity = 0;
  unsigned filter_blocks = 0;
  std::size_t filter_warps = 0;
  std::size_t chunk = 0;
  std::size_t flush_capacity = 0;
  std::size_t warp_scan_bytes = 0;
};

template <class Index>
EncodePlan plan_encode(const EncodeCall& c, Mode mode, std::size_t k, const Pick& pick) {
  const std::size_t n = c.n;
  const cudaStream_t s = c.ws->stream();
  EncodePlan p;
  p.mode = mode;
  p.n = n;
  p.k = k;
  p.ranked = mode != Mode::threshold && k < n;
  if (!p.ranked) {
    GCOMP_CUDA(cub::DeviceSelect::If(nullptr, p.cub_bytes, thrust::counting_iterator<Index>(0),
                                     static_cast<Index*>(nullptr),
                                     static_cast<unsigned long long*>(nullptr),
                                     static_cast<std::int64_t>(n), pick, s));
  }
  p.tiles = (n + kTieTile - 1) / kTieTile;
  p.tile_slots = p.ranked ? p.tiles + 1 : 0;
  if (p.ranked) {
    GCOMP_CUDA(cub::DeviceScan::ExclusiveSum(nullptr, p.tile_scan_bytes,
                                             static_cast<unsigned long long*>(nullptr),
                                             static_cast<unsigned long long*>(nullptr),
                                             static_cast<std::int64_t>(p.tile_slots), s));
  }
  p.cand_capacity = p.ranked ? std::min(n, std::max(n / 16, std::size_t{1} << 20)) : 0;
  p.max_blocks = std::max<std::size_t>(1, (k + kBlock - 1) / kBlock);
  GCOMP_CUDA(cub::DeviceScan::ExclusiveSum(nullptr, p.scan_bytes,
                                           static_cast<unsigned long long*>(nullptr),
                                           static_cast<unsigned long long*>(nullptr),
                                           static_cast<int>(p.max_blocks), s));
  p.sample = std::min(kSampleMax, n / 8);
  p.rank = mode == Mode::topk && p.ranked && n >= kSampleMin ? sample_rank(k, n, p.sample) : 0;
  p.sampled = p.rank > 0 && k <= n / 8;
  p.sample_capacity = p.sampled ? std::min(n, 2 * k + (std::size_t{1} << 16)) : 0;
  if (p.sampled) {
    constexpr std::size_t kRound = 32 * kFilterUnroll;
    p.filter_blocks =
        c.e_old ? resident_grid(filter_kernel<true, Index>, grid_for(n, kThreads * kFilterUnroll))
                : resident_grid(filter_kernel<false, Index>,
                                grid_for(n, kThreads * kFilterUnroll));
    p.filter_warps = static_cast<std::size_t>(p.filter_blocks) * (kThreads / 32);
    p.chunk = ((n + p.filter_warps - 1) / p.filter_warps + kRound - 1) / kRound * kRound;
    // A flush other than a warp's last moves more than kFilterBuffer - kRound entries.
    p.flush_capacity = p.filter_warps + p.sample_capacity / (kFilterBuffer - kRound) + 1;
    GCOMP_CUDA(cub::DeviceScan::ExclusiveSum(nullptr, p.warp_scan_bytes,
                                             static_cast<unsigned long long*>(nullptr),
                                             static_cast<unsigned long long*>(nullptr),
                                             static_cast<std::int64_t>(p.filter_warps), s));
  }
  return p;
}

// The workspace's buffers, in the order carve_buffers takes them.
template <class Index>
struct EncodeBuffers {
  unsigned long long* hist;
  SelectState* st;
  unsigned long long* tile_ties;
  Index* idx;
  unsigned long long* selected;
  void* cub_temp;
  Index* cand_index;
  unsigned long long* cand_count;
  unsigned long long* tile_sel;
  unsigned long long* tile_offsets;
  void* tile_scan_temp;
  unsigned char* widths;
  unsigned long long* block_bytes;
  unsigned long long* block_offsets;
  void* scan_temp;
  std::uint32_t* sample_keys;
  unsigned long long* sample_hist;
  SelectState* sample_st;
  Index* filtered_index;
  float* filtered_value;
  unsigned long long* filtered_counts;
  Flush* flushes;
  unsigned long long* warp_totals;
  unsigned long long* warp_offsets;
  void* warp_scan_temp;
  Index* ordered_index;
  float* ordered_value;
  float* selected_values;
};

// The buffers of plan p, taken from `carve` in one order: a Carve without memory sizes them
// (null pointers), one on the reserved workspace places them.
template <class Index>
EncodeBuffers<Index> carve_buffers(Carve& carve, const EncodePlan& p) {
  EncodeBuffers<Index> b;
  b.hist = carve.take<unsigned long long>(kBins);
  b.st = carve.take<SelectState>(1);
  b.tile_ties = carve.take<unsigned long long>(p.tiles);
  b.idx = carve.take<Index>(p.k);
  b.selected = carve.take<unsigned long long>(1);
  b.cub_temp = carve.take<unsigned char>(p.cub_bytes);
  b.cand_index = carve.take<Index>(p.cand_capacity);
  b.cand_count = carve.take<unsigned long long>(1);
  b.tile_sel = carve.take<unsigned long long>(p.tile_slots);
  b.tile_offsets = carve.take<unsigned long long>(p.tile_slots);
  b.tile_scan_temp = carve.take<unsigned char>(p.tile_scan_bytes);
  b.widths = carve.take<unsigned char>(p.max_blocks);
  b.block_bytes = carve.take<unsigned long long>(p.max_blocks);
  b.block_offsets = carve.take<unsigned long long>(p.max_blocks);
  b.scan_temp = carve.take<unsigned char>(p.scan_bytes);
  b.sample_keys = carve.take<std::uint32_t>(p.sample);
  b.sample_hist = carve.take<unsigned long long>(p.sampled ? kBins : 0);
  b.sample_st = carve.take<SelectState>(p.sampled ? 1 : 0);
  b.filtered_index = carve.take<Index>(p.sample_capacity);
  b.filtered_value = carve.take<float>(p.sample_capacity);
  b.filtered_counts = carve.take<unsigned long long>(p.sampled ? 2 : 0);
  b.flushes = carve.take<Flush>(p.flush_capacity);
  b.warp_totals = carve.take<unsigned long long>(p.filter_warps);
  b.warp_offsets = carve.take<unsigned long long>(p.filter_warps);
  b.warp_scan_temp = carve.take<unsigned char>(p.warp_scan_bytes);
  b.ordered_index = carve.take<Index>(p.sample_capacity);
  b.ordered_value = carve.take<float>(p.sample_capacity);
  b.selected_values = carve.take<float>(p.sampled ? p.k : 0);
  return b;
}

// One encode of a sparse codec into c's payload, stage by stage (encode_sparse_as runs them).
template <class Index>
class SparseEncode {
 public:
  // The plan and the workspace, carved.
  explicit SparseEncode(const EncodeCall& c)
      : c_(c),
        kind_(c.codec->kind()),
        mode_(mode_of(kind_)),
        cp_(c.codec->params()),
        n_(c.n),
        k_(mode_ == Mode::threshold ? n_ : c.codec->selected(n_)),
        s_(c.ws->stream()),
        v_(c.e_old ? c.e_new : c.x),
        keys_{v_, mode_, static_cast<std::uint32_t>(c.seed),
              static_cast<std::uint32_t>(c.seed >> 32), static_cast<std::uint32_t>(kind_)} {
    if (mode_ != Mode::threshold) {
      gcomp::detail::require_capacity(c.codec->max_bytes(n_), c.cap);
    }
    const std::uint32_t tau_bits =
        mode_ == Mode::threshold ? gcomp::detail::float_bits(static_cast<float>(cp_.tau)) : 0;
    pick_ = Pick{keys_, nullptr, mode_, tau_bits};
    p_ = plan_encode<Index>(c, mode_, k_, pick_);
    Carve size;
    carve_buffers<Index>(size, p_);
    Carve carve(c.ws->reserve(size.bytes()));
    b_ = carve_buffers<Index>(carve, p_);
    pick_.st = b_.st;
    stages_.emplace(s_, "encode", codec_name(kind_), n_);
  }

  // The select's state, and the first level's histogram zeroed.
  void start() {
    c_.ws->reset_report();
    SelectState init{};
    init.need = k_;
    init.all = mode_ != Mode::threshold && k_ >= n_ ? 1u : 0u;
    init.cut = ~0ull;
    init.cut_tile = ~0ull;
    GCOMP_CUDA(cudaMemcpyAsync(b_.st, &init, sizeof init, cudaMemcpyHostToDevice, s_));
    GCOMP_CUDA(cudaMemsetAsync(b_.hist, 0, kBins * sizeof(unsigned long long), s_));
  }

  // The selection, into idx (ascending): from a sample's candidates where the sample's
  // threshold held, else from the tensor. Returns where the selected count lands.
  const unsigned long long* select() {
    if (p_.sampled) {
      sample_threshold();
      if (filter()) return select_ranked(found_, candidate_keys(), b_.ordered_index,
                                         b_.selected_values);
      // The sample's threshold missed: the select reads the tensor (v, written by the filter).
      first_pass_kernel<false><<<first_grid(first_pass_kernel<false>, n_, true), kThreads, 0,
                                 s_>>>(v_, nullptr, nullptr, n_, keys_, b_.hist,
                                       c_.ws->report());
      GCOMP_LAUNCHED("sparse first pass");
      stages_->mark("first_pass");
    } else if (n_ > 0) {
      first_pass();
    }
    if (p_.ranked) return select_ranked(n_, keys_, nullptr, nullptr);
    if (n_ > 0) {
      GCOMP_CUDA(cub::DeviceSelect::If(b_.cub_temp, p_.cub_bytes,
                                       thrust::counting_iterator<Index>(0), b_.idx, b_.selected,
                                       static_cast<std::int64_t>(n_), pick_, s_));
      stages_->mark("select");
    }
    return b_.selected;
  }

  // The selected count comes back: threshold's sizes the header, so it comes before the widths;
  // top-k's and random-k's must be k (the select is exact), which widths() checks with the
  // packed size, one wait for both. Returns the entries.
  std::size_t count_back(const unsigned long long* count_at) {
    if (n_ > 0) {
      GCOMP_CUDA(cudaMemcpyAsync(&got_, count_at, sizeof got_, cudaMemcpyDeviceToHost, s_));
    }
    std::size_t nnz = k_;
    if (!p_.ranked) {
      if (c_.ws->finish().code == kNonfinite) throw_nonfinite(c_.x, c_.e_old, n_, *c_.ws);
      if (mode_ == Mode::threshold) nnz = static_cast<std::size_t>(got_);
    }
    stages_->mark("count_back");
    return nnz;
  }

  // The packed indices' size: each block's width and bytes, their offsets, the total.
  std::size_t widths(std::size_t nnz) {
    blocks_ = (nnz + kBlock - 1) / kBlock;
    unsigned long long last[2] = {0, 0};
    if (blocks_ > 0) {
      block_width_kernel<Index><<<grid_for(blocks_, kThreads / 32), kThreads, 0, s_>>>(
          b_.idx, nnz, b_.widths, b_.block_bytes);
      GCOMP_CUDA(cub::DeviceScan::ExclusiveSum(b_.scan_temp, p_.scan_bytes, b_.block_bytes,
                                               b_.block_offsets, static_cast<int>(blocks_), s_));
      GCOMP_LAUNCHED("sparse index widths");
      GCOMP_CUDA(cudaMemcpyAsync(&last[0], b_.block_offsets + blocks_ - 1, sizeof last[0],
                                 cudaMemcpyDeviceToHost, s_));
      GCOMP_CUDA(cudaMemcpyAsync(&last[1], b_.block_bytes + blocks_ - 1, sizeof last[1],
                                 cudaMemcpyDeviceToHost, s_));
    }
    if (p_.ranked) {
      if (c_.ws->finish().code == kNonfinite) throw_nonfinite(c_.x, c_.e_old, n_, *c_.ws);
      if (n_ > 0 && got_ != k_) {
        throw Error(Status::internal, "CUDA top-k select kept " + std::to_string(got_) +
                                          " entries instead of " + std::to_string(k_));
      }
    } else if (blocks_ > 0) {
      GCOMP_CUDA(cudaStreamSynchronize(s_));
    }
    stages_->mark("widths");
    return blocks_ > 0 ? static_cast<std::size_t>(last[0] + last[1]) : 0;
  }

  // The header, the packed indices and the values (with error feedback, v - sent at the sent
  // entries). Returns the payload's bytes.
  std::size_t write(std::size_t nnz, std::size_t packed) {
    const std::size_t vb = cp_.fp16_values ? 2 : 4;
    const std::size_t head_bytes = gcomp::detail::header_bytes(gcomp::detail::Layout{16, 2});
    const std::size_t need = head_bytes + packed + nnz * vb;
    // The CPU's check: room for the indices' worst packing (for top-k and random-k, max_bytes
    // above), so that a buffer serves on both or on neither.
    gcomp::detail::require_capacity(
        head_bytes + gcomp::detail::packed_indices_bound(nnz, n_) + nnz * vb, c_.cap);
    std::byte params[16] = {};
    params[0] = std::byte{static_cast<unsigned char>(cp_.fp16_values ? 1 : 0)};
    params[1] = std::byte{0};  // packed gaps
    gcomp::detail::store_le<std::uint64_t>(params + 8, nnz);
    std::byte head[gcomp::detail::kMaxHeaderBytes];
    const std::byte* end =
        gcomp::detail::write_header(head, kind_, n_, params, {packed, nnz * vb});
    unsigned char* ip = put_header(c_, reinterpret_cast<const unsigned char*>(head),
                                   static_cast<std::size_t>(end - head));
    const float mul = (mode_ == Mode::randomk && cp_.scale && nnz > 0)
                          ? static_cast<float>(static_cast<double>(n_) / static_cast<double>(nnz))
                          : 1.0f;
    if (nnz > 0) {
      pack_kernel<Index><<<grid_for(blocks_, kThreads / 32), kThreads, 0, s_>>>(
          b_.idx, nnz, b_.widths, b_.block_offsets, ip);
      stages_->mark("pack");
      emit_kernel<Index><<<grid_for(nnz), kThreads, 0, s_>>>(
          b_.idx, nullptr, nnz, v_, sampled_done_ ? b_.selected_values : nullptr,
          c_.e_old ? c_.e_new : nullptr, 0, cp_.fp16_values, mul, nullptr, ip + packed);
      GCOMP_LAUNCHED("sparse emit");
      stages_->mark("emit");
    }
    c_.ws->finish();
    stages_->mark("finish");
    return need;
  }

 private:
  // The threshold: the sample's rank-th largest key to its top 22 bits (two levels of the radix
  // select on the sample, its own state).
  void sample_threshold() {
    SelectState sinit{};
    sinit.need = p_.rank;
    sinit.cut = ~0ull;
    sinit.cut_tile = ~0ull;
    GCOMP_CUDA(cudaMemcpyAsync(b_.sample_st, &sinit, sizeof sinit, cudaMemcpyHostToDevice, s_));
    GCOMP_CUDA(cudaMemsetAsync(b_.sample_hist, 0, kBins * sizeof(unsigned long long), s_));
    GCOMP_CUDA(cudaMemsetAsync(b_.filtered_counts, 0, 2 * sizeof(unsigned long long), s_));
    sample_kernel<<<grid_for(p_.sample), kThreads, 0, s_>>>(c_.x, c_.e_old, n_, p_.sample,
                                                          b_.sample_keys, b_.sample_hist);
    pick_bin_kernel<<<1, kScanThreads, 0, s_>>>(b_.sample_hist, 21, 11, false, b_.sample_st);
    const Candidates<Index> none{nullptr, nullptr, 0};
    const Keys sk{reinterpret_cast<const float*>(b_.sample_keys), Mode::topk, 0, 0, 0};
    hist_kernel<Index><<<resident_grid(hist_kernel<Index>, grid_for_rounds(p_.sample)), kThreads,
                         0, s_>>>(p_.sample, sk, 10, 11, b_.sample_st, b_.sample_hist, none,
                                  none, nullptr, false, p_.sample);
    pick_bin_kernel<<<1, kScanThreads, 0, s_>>>(b_.sample_hist, 10, 11, false, b_.sample_st);
    GCOMP_LAUNCHED("top-k sample");
    stages_->mark("sample");
  }

  // The one pass over the tensor that keeps the keys at or above the sample's threshold; their
  // number comes back (found_). Where it is at least k and fits, the candidates go in order and
  // their first level's histogram is counted: true. Else false.
  bool filter() {
    const Filtered<Index> to{b_.filtered_index, b_.filtered_value, b_.filtered_counts,
                             p_.sample_capacity,  b_.flushes,       b_.filtered_counts + 1,
                             p_.flush_capacity,   b_.warp_totals};
    const std::uint32_t* threshold = &b_.sample_st->prefix;
    if (c_.e_old) {
      filter_kernel<true, Index><<<p_.filter_blocks, kThreads, 0, s_>>>(
          c_.x, c_.e_old, c_.e_new, n_, p_.chunk, threshold, to, c_.ws->report());
    } else {
      filter_kernel<false, Index><<<p_.filter_blocks, kThreads, 0, s_>>>(
          c_.x, nullptr, nullptr, n_, p_.chunk, threshold, to, c_.ws->report());
    }
    GCOMP_LAUNCHED("top-k filter");
    stages_->mark("filter");
    unsigned long long found = 0;
    GCOMP_CUDA(
        cudaMemcpyAsync(&found, b_.filtered_counts, sizeof found, cudaMemcpyDeviceToHost, s_));
    if (c_.ws->finish().code == kNonfinite) throw_nonfinite(c_.x, c_.e_old, n_, *c_.ws);
    stages_->mark("filter_count");
    if (found < k_ || found > p_.sample_capacity) return false;
    found_ = static_cast<std::size_t>(found);
    GCOMP_CUDA(cub::DeviceScan::ExclusiveSum(b_.warp_scan_temp, p_.warp_scan_bytes,
                                             b_.warp_totals, b_.warp_offsets,
                                             static_cast<std::int64_t>(p_.filter_warps), s_));
    order_kernel<Index><<<grid_for(p_.flush_capacity, kThreads / 32), kThreads, 0, s_>>>(
        to, b_.warp_offsets, b_.ordered_index, b_.ordered_value);
    GCOMP_LAUNCHED("top-k candidates");
    stages_->mark("order");
    const Keys ck = candidate_keys();
    first_pass_kernel<false><<<first_grid(first_pass_kernel<false>, found_, true), kThreads, 0,
                               s_>>>(b_.ordered_value, nullptr, nullptr, found_, ck, b_.hist,
                                     c_.ws->report());
    GCOMP_LAUNCHED("top-k candidates' histogram");
    stages_->mark("first_pass");
    sampled_done_ = true;
    return true;
  }

  // The candidates' keys: top-k's, of their values in order.
  Keys candidate_keys() const { return Keys{b_.ordered_value, Mode::topk, 0, 0, 0}; }

  // v = x + e (error feedback), the non-finite check and, for a ranked selection, the first
  // level's histogram, over the tensor.
  void first_pass() {
    unsigned long long* hist = p_.ranked ? b_.hist : nullptr;
    if (c_.e_old) {
      first_pass_kernel<true><<<first_grid(first_pass_kernel<true>, n_, p_.ranked), kThreads, 0,
                                s_>>>(c_.x, c_.e_old, c_.e_new, n_, keys_, hist,
                                      c_.ws->report());
    } else {
      first_pass_kernel<false><<<first_grid(first_pass_kernel<false>, n_, p_.ranked), kThreads,
                                 0, s_>>>(c_.x, nullptr, nullptr, n_, keys_, hist,
                                          c_.ws->report());
    }
    GCOMP_LAUNCHED("sparse first pass");
    stages_->mark("first_pass");
  }

  // The exact select of the k largest keys of nr elements (the tensor, or a sample's
  // candidates, whose indices `map` holds in ascending order), from their first level's
  // histogram in hist: the selected indices into idx, ascending. Returns where the selected
  // count lands.
  const unsigned long long* select_ranked(std::size_t nr, const Keys& kr, const Index* map,
                                          float* vals) {
    const std::size_t tr = (nr + kTieTile - 1) / kTieTile;
    const std::size_t slots = tr + 1;
    // The second level's candidates: never more than nr.
    const std::size_t cap = std::min(p_.cand_capacity, nr);
    const Candidates<Index> none{nullptr, nullptr, 0};
    const Candidates<Index> cand{b_.cand_index, b_.cand_count, cap};
    const SelectState* st = b_.st;
    unsigned long long* hist = b_.hist;
    GCOMP_CUDA(cudaMemsetAsync(b_.cand_count, 0, sizeof *b_.cand_count, s_));
    GCOMP_CUDA(cudaMemsetAsync(b_.tile_ties, 0, tr * sizeof(unsigned long long), s_));
    GCOMP_CUDA(cudaMemsetAsync(b_.tile_sel, 0, slots * sizeof(unsigned long long), s_));
    pick_bin_kernel<<<1, kScanThreads, 0, s_>>>(hist, 21, 11, false, b_.st);
    stages_->mark("pick1");
    const unsigned hist_grid = resident_grid(hist_kernel<Index>, grid_for_rounds(nr));
    hist_kernel<Index><<<hist_grid, kThreads, 0, s_>>>(nr, kr, 10, 11, st, hist, none, cand,
                                                       b_.tile_sel, false, cap);
    stages_->mark("hist2");
    pick_bin_kernel<<<1, kScanThreads, 0, s_>>>(hist, 10, 11, false, b_.st);
    stages_->mark("pick2");
    // The third histogram from the candidates, or (when they did not fit) from all nr.
    hist_kernel<Index><<<resident_grid(hist_kernel<Index>, grid_for_rounds(cap)), kThreads, 0,
                         s_>>>(nr, kr, 0, 10, st, hist, cand, none, nullptr, false, cap);
    hist_kernel<Index><<<hist_grid, kThreads, 0, s_>>>(nr, kr, 0, 10, st, hist, none, none,
                                                       nullptr, true, cap);
    stages_->mark("hist3");
    pick_bin_kernel<<<1, kScanThreads, 0, s_>>>(hist, 0, 10, true, b_.st);
    stages_->mark("pick3");
    // The ties per tile (from the candidates, or from all nr when they did not fit), the cut.
    cand_tiles_kernel<Index><<<resident_grid(cand_tiles_kernel<Index>, grid_for(cap)), kThreads,
                               0, s_>>>(cand, kr, st, cap, b_.tile_sel, b_.tile_ties);
    tie_count_kernel<<<grid_for(tr, 1), kThreads, 0, s_>>>(nr, kr, st, b_.tile_ties, cap);
    stages_->mark("tie_count");
    tie_cut_kernel<<<1, kScanThreads, 0, s_>>>(nr, kr, b_.tile_ties, b_.st);
    stages_->mark("tie_cut");
    // Each tile's selected count, their offsets, the ordered write.
    tile_ties_kernel<<<grid_for(tr), kThreads, 0, s_>>>(tr, st, cap, b_.tile_ties, b_.tile_sel);
    tile_count_kernel<<<grid_for(tr, 1), kThreads, 0, s_>>>(nr, kr, st, cap, b_.tile_sel);
    GCOMP_CUDA(cub::DeviceScan::ExclusiveSum(b_.tile_scan_temp, p_.tile_scan_bytes, b_.tile_sel,
                                             b_.tile_offsets, static_cast<std::int64_t>(slots),
                                             s_));
    stages_->mark("tile_counts");
    ordered_write_kernel<Index><<<grid_for(tr, 1), kThreads, 0, s_>>>(
        nr, kr, st, b_.tile_offsets, map, b_.idx, vals, k_);
    GCOMP_LAUNCHED("radix select");
    stages_->mark("select");
    return b_.tile_offsets + tr;
  }

  const EncodeCall& c_;
  CodecKind kind_;
  Mode mode_;
  gcomp::detail::CodecParams cp_;
  std::size_t n_;
  std::size_t k_;
  cudaStream_t s_;
  const float* v_;  // what is selected from: x, or v = x + e in e_new
  Keys keys_;
  Pick pick_{};
  EncodePlan p_;
  EncodeBuffers<Index> b_{};
  std::optional<Stages> stages_;
  std::size_t found_ = 0;      // the filter's candidates, where they were used
  bool sampled_done_ = false;  // the selection came from them (its values in selected_values)
  unsigned long long got_ = 0;  // the selected count, back on the host
  std::size_t blocks_ = 0;      // blocks of packed indices
};

// One encode, as a driver of named stages.
template <class Index>
std::size_t encode_sparse_as(const EncodeCall& c) {
  SparseEncode<Index> e(c);
  e.start();
  const unsigned long long* count_at = e.select();
  const std::size_t nnz = e.count_back(count_at);
  const std::size_t packed = e.widths(nnz);
  return e.write(nnz, packed);
}

std::size_t encode_sparse(const EncodeCall& c) {
  // Indices fit 32 bits up to n = 2^32 (the largest index is n - 1).
  if (gcomp::detail::index_width(c.n) == 4) return encode_sparse_as<std::uint32_t>(c);
  return encode_sparse_as<std::uint64_t>(c);
}

}  // namespace

std::span<const DeviceCodec> sparse_device_codecs() {
  static const DeviceCodec list[] = {{CodecKind::topk, encode_sparse, decode_sparse},
                                     {CodecKind::randomk, encode_sparse, decode_sparse},
                                     {CodecKind::threshold, encode_sparse, decode_sparse}};
  return list;
}

}  // namespace gcomp::cuda::detail
