// Top-k per chunk on the device (compressors/topk_chunked.cpp, docs/wire-format.md): the CPU's
// payload, byte for byte.
//
// Encode, in three stages:
//   1. select_kernel, a block per chunk: v = x + e_old into e_new (error feedback) and the
//      non-finite check; the chunk's kk-th largest key T (the bits of |v|) by a radix select over
//      11, 11 and 10 key bits, each level a histogram in shared memory and a block scan from the
//      highest bin to the one that holds the need-th key; then the entries (key > T, and the
//      first `ties` keys equal to T in index order) in ascending order, tile by tile, placed by
//      block scans of their flags at the chunk's first entry, c kc (every chunk but the last
//      holds kc entries, so no scan across chunks is needed); their float32 or binary16 values,
//      or their codes: levels from the chunk's largest kept |v|, the least-squares scale summed
//      by one thread in ascending order in double (each product exact: the CPU's sums, bit for
//      bit), and with error feedback e = v - sent at them.
//   2. The index section's two sizes: the chunk-relative format's from the counts, the packed
//      gaps' from each 128-entry block's width (index_pack.cuh) and a scan; the smaller is
//      written (the gaps only when strictly smaller), as the CPU chooses.
//   3. The header (the CPU's write_header), the indices (pack_kernel, or relative_kernel: a
//      thread per output byte), the scales, and the values (codes_kernel: a thread per byte).
// Decode: the sections come to the host, where the CPU's code checks them and reads the entries
// (read_sparse_entries: its messages); the indices and float32 values go back for a scatter,
// acc[i] += alpha * v, the CPU's operation on the CPU's values. (Decoding on the device is the
// same step as the sparse codecs' packed indices still to take.)
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <string>
#include <vector>

#include "bytes.hpp"
#include "codecs.cuh"
#include "half_bits.hpp"
#include "index_pack.cuh"

namespace gcomp::cuda::detail {

namespace {

constexpr unsigned kF32 = 0, kF16 = 1, kCodes = 2;

// The counts of a tensor cut into chunks (the CPU's Shape).
struct Chunks {
  std::uint64_t n, chunk, per_chunk, last, count, nnz;
  __host__ __device__ std::uint64_t chunk_of(std::uint64_t j) const {
    if (per_chunk == 0) return count - 1;
    const std::uint64_t c = j / per_chunk;
    return c < count - 1 ? c : count - 1;
  }
};

// What select_kernel leaves per entry: the value's bits (f32), its binary16 bits, or its code.
struct Selection {
  void* idx;           // Index[nnz]: the global indices
  std::uint32_t* val;  // [nnz]
  float* scales;       // [count], codes only
};

using BlockScan = cub::BlockScan<unsigned, kThreads>;
using BlockMax = cub::BlockReduce<unsigned, kThreads>;
struct MaxOf {
  __device__ unsigned operator()(unsigned a, unsigned b) const { return a > b ? a : b; }
};

// The block's inclusive prefix of `flag` and the total, on every thread.
__device__ __forceinline__ unsigned scan_flags(BlockScan::TempStorage& tmp, unsigned flag,
                                               unsigned* total) {
  unsigned incl = 0;
  BlockScan(tmp).InclusiveSum(flag, incl, *total);
  __syncthreads();  // tmp is reused
  return incl;
}

// What a block's select keeps in shared memory, one chunk at a time.
struct SelectShared {
  unsigned hist[2048];
  BlockScan::TempStorage scan_tmp;
  BlockMax::TempStorage max_tmp;
  unsigned found_bin, found_need, max_bits;
  float scale;
};

// v = x (+ e_old, into e_new) over the chunk [b, b + len); whether any of it is NaN or Inf, on
// every thread.
__device__ __forceinline__ bool chunk_nonfinite(const float* __restrict__ x,
                                                const float* __restrict__ e_old, float* e_new,
                                                std::uint64_t b, std::uint64_t len) {
  bool bad = false;
  for (std::uint64_t i = threadIdx.x; i < len; i += blockDim.x) {
    float v = x[b + i];
    if (e_old) {
      v = __fadd_rn(v, e_old[b + i]);
      e_new[b + i] = v;
    }
    bad |= nonfinite(v);
  }
  return __syncthreads_or(bad);
}

// The kk-th largest key T of the chunk's len values v and how many equal to it are taken
// (ties): three levels of a radix select over 11, 11 and 10 key bits.
__device__ __forceinline__ void chunk_threshold(const float* v, std::uint64_t len,
                                                std::uint64_t kk, SelectShared& sh,
                                                std::uint32_t* T, std::uint64_t* ties) {
  const unsigned t = threadIdx.x;
  std::uint32_t prefix = 0;
  std::uint64_t need = kk;
  if (kk < len) {
    const int shifts[3] = {21, 10, 0};
    const int widths[3] = {11, 11, 10};
    for (int level = 0; level < 3; ++level) {
      const int shift = shifts[level];
      const unsigned bins = 1u << widths[level];
      const int hi = shift + widths[level];
      for (unsigned q = t; q < bins; q += blockDim.x) sh.hist[q] = 0;
      __syncthreads();
      for (std::uint64_t i = t; i < len; i += blockDim.x) {
        const std::uint32_t key = __float_as_uint(v[i]) & 0x7fffffffu;
        if (hi >= 32 || (key >> hi) == (prefix >> hi)) {
          atomicAdd(&sh.hist[(key >> shift) & (bins - 1)], 1u);
        }
      }
      __syncthreads();
      // Thread t owns bins [bins - (t + 1) per, bins - t per), walked from the top.
      const unsigned per = bins / kThreads;
      unsigned mine = 0;
      for (unsigned q = 0; q < per; ++q) mine += sh.hist[bins - 1 - (t * per + q)];
      unsigned total = 0;
      const unsigned incl = scan_flags(sh.scan_tmp, mine, &total);
      const unsigned excl = incl - mine;
      if (excl < need && incl >= need) {
        unsigned cum = excl;
        for (unsigned q = 0; q < per; ++q) {
          const unsigned bin = bins - 1 - (t * per + q);
          if (cum + sh.hist[bin] >= need) {
            sh.found_bin = bin;
            sh.found_need = static_cast<unsigned>(need - cum);
            break;
          }
          cum += sh.hist[bin];
        }
      }
      __syncthreads();
      prefix |= sh.found_bin << shift;
      need = sh.found_need;
      __syncthreads();
    }
  }
  *T = prefix;
  *ties = need;
}

// The chunk's kk entries in ascending order into idx[first, first + kk): key > T, or the first
// `ties` equal to T (every entry where kk == len).
template <class Index>
__device__ __forceinline__ void chunk_indices(const float* v, std::uint64_t b, std::uint64_t len,
                                              std::uint64_t kk, std::uint64_t first,
                                              std::uint32_t T, std::uint64_t ties, Index* idx,
                                              SelectShared& sh) {
  const unsigned t = threadIdx.x;
  unsigned taken = 0, equal = 0;
  for (std::uint64_t base = 0; base < len; base += blockDim.x) {
    const std::uint64_t i = base + t;
    const std::uint32_t key = i < len ? __float_as_uint(v[i]) & 0x7fffffffu : 0u;
    unsigned eq_total = 0;
    const unsigned is_eq = i < len && kk < len && key == T ? 1u : 0u;
    const unsigned eq_rank = equal + scan_flags(sh.scan_tmp, is_eq, &eq_total) - is_eq;
    const unsigned take = i < len && (kk == len || key > T || (is_eq && eq_rank < ties)) ? 1u : 0u;
    unsigned take_total = 0;
    const unsigned pos = taken + scan_flags(sh.scan_tmp, take, &take_total) - take;
    if (take) idx[first + pos] = static_cast<Index>(b + i);
    taken += take_total;
    equal += eq_total;
  }
}

// The kept values as float32 or fp16 bits; with error feedback e_new = v - sent there.
template <class Index>
__device__ __forceinline__ void chunk_values(const float* x, const float* e_old, float* e_new,
                                             const Index* idx, std::uint64_t first,
                                             std::uint64_t kk, bool fp16, Selection out) {
  for (std::uint64_t j = threadIdx.x; j < kk; j += blockDim.x) {
    const std::uint64_t i = static_cast<std::uint64_t>(idx[first + j]);
    const float a = (e_old ? e_new : x)[i];
    float sent = a;
    if (fp16) {
      const std::uint32_t h = half_bits_of(a);  // the CPU's integer steps: half_bits.hpp
      out.val[first + j] = h;
      sent = from_half(h);
    } else {
      out.val[first + j] = __float_as_uint(a);
    }
    if (e_old) e_new[i] = __fsub_rn(a, sent);
  }
}

// The kept values as codes of `bits` bits (sign and level under the largest kept |v|), chunk
// c's least-squares scale, and with error feedback e_new = v - decode there.
template <class Index>
__device__ __forceinline__ void chunk_codes(const float* x, const float* e_old, float* e_new,
                                            const Index* idx, std::uint64_t c, std::uint64_t first,
                                            std::uint64_t kk, int bits, Selection out,
                                            SelectShared& sh) {
  const unsigned t = threadIdx.x;
  // The largest kept |v| (as bits: non-negative floats order as their bits).
  unsigned m_bits = 0;
  for (std::uint64_t j = t; j < kk; j += blockDim.x) {
    const std::uint64_t i = static_cast<std::uint64_t>(idx[first + j]);
    m_bits = max(m_bits, __float_as_uint((e_old ? e_new : x)[i]) & 0x7fffffffu);
  }
  const unsigned agg = BlockMax(sh.max_tmp).Reduce(m_bits, MaxOf());
  if (t == 0) sh.max_bits = agg;
  __syncthreads();
  const float m = __uint_as_float(sh.max_bits);
  const std::uint32_t levels = 1u << (bits - 1);
  for (std::uint64_t j = t; j < kk; j += blockDim.x) {
    const std::uint64_t i = static_cast<std::uint64_t>(idx[first + j]);
    const float vi = (e_old ? e_new : x)[i];
    const float a = fabsf(vi);
    std::uint32_t l = 0;
    if (m > 0) {
      const float ratio = __fdiv_rn(a, m);
      const auto f = static_cast<std::uint32_t>(__fmul_rn(ratio, static_cast<float>(levels)));
      l = f < levels - 1 ? f : levels - 1;
    }
    out.val[first + j] = l | (vi < 0 ? levels : 0u);
  }
  __syncthreads();
  if (t == 0) {
    // The least-squares scale in the CPU's order: one thread, ascending entries.
    double num = 0, den = 0;
    const double unit = 1.0 / static_cast<double>(1u << bits);
    for (std::uint64_t j = 0; j < kk; ++j) {
      const std::uint64_t i = static_cast<std::uint64_t>(idx[first + j]);
      const double a = static_cast<double>(fabsf((e_old ? e_new : x)[i]));
      const double q = static_cast<double>(2 * (out.val[first + j] & (levels - 1)) + 1) * unit;
      num = __dadd_rn(num, __dmul_rn(a, q));
      den = __dadd_rn(den, __dmul_rn(q, q));
    }
    const double ls = den > 0 ? __ddiv_rn(num, den) : 0.0;
    const float sc = ls > static_cast<double>(FLT_MAX) ? FLT_MAX : __double2float_rn(ls);
    out.scales[c] = sc;
    sh.scale = sc;
  }
  __syncthreads();
  if (e_old) {
    const float sc = sh.scale;
    for (std::uint64_t j = t; j < kk; j += blockDim.x) {
      const std::uint64_t i = static_cast<std::uint64_t>(idx[first + j]);
      const std::uint32_t code = out.val[first + j];
      const float q = ldexpf(static_cast<float>(2 * (code & (levels - 1)) + 1), -bits);
      const float d = __fmul_rn(sc, q);
      e_new[i] = __fsub_rn(e_new[i], (code & levels) ? -d : d);
    }
  }
}

// A block per chunk in turn (chunk c of s.count): its values checked, its threshold, its
// entries in ascending order, then their values or codes.
template <class Index>
__global__ void __launch_bounds__(kThreads)
    select_kernel(const float* __restrict__ x, const float* __restrict__ e_old, float* e_new,
                  Chunks s, int bits, bool fp16, Selection out, Report* r) {
  __shared__ SelectShared sh;
  Index* idx = static_cast<Index*>(out.idx);
  for (std::uint64_t c = blockIdx.x; c < s.count; c += gridDim.x) {
    const std::uint64_t b = c * s.chunk;
    const std::uint64_t len = s.n - b < s.chunk ? s.n - b : s.chunk;
    const std::uint64_t kk = c + 1 == s.count ? s.last : s.per_chunk;
    const std::uint64_t first = c * s.per_chunk;
    if (chunk_nonfinite(x, e_old, e_new, b, len)) {
      if (threadIdx.x == 0) report_nonfinite(r);
      continue;  // uniform: every thread saw the same
    }
    const float* v = (e_old ? e_new : x) + b;
    std::uint32_t T = 0;
    std::uint64_t ties = 0;
    chunk_threshold(v, len, kk, sh, &T, &ties);
    chunk_indices<Index>(v, b, len, kk, first, T, ties, idx, sh);
    __syncthreads();  // the indices, for every thread
    if (bits == 0) {
      chunk_values<Index>(x, e_old, e_new, idx, first, kk, fp16, out);
      continue;
    }
    chunk_codes<Index>(x, e_old, e_new, idx, c, first, kk, bits, out, sh);
    __syncthreads();  // shared state is the next chunk's
  }
}

// The chunk-relative indices in w bits each (w <= 32), a thread per output byte.
template <class Index>
__global__ void relative_kernel(const Index* __restrict__ idx, Chunks s, unsigned w,
                                unsigned char* __restrict__ out, std::size_t bytes) {
  GCOMP_GRID_LOOP(o, bytes) {
    const std::uint64_t lo = 8 * static_cast<std::uint64_t>(o);
    unsigned acc = 0;
    for (std::uint64_t j = lo / w; j < s.nnz && j * w < lo + 8; ++j) {
      const std::uint64_t rel = static_cast<std::uint64_t>(idx[j]) - s.chunk_of(j) * s.chunk;
      const std::int64_t at = static_cast<std::int64_t>(j * w) - static_cast<std::int64_t>(lo);
      const unsigned long long part =
          at >= 0 ? static_cast<unsigned long long>(rel) << at
                  : static_cast<unsigned long long>(rel) >> (-at);
      acc |= static_cast<unsigned>(part & 0xffu);
    }
    out[o] = static_cast<unsigned char>(acc);
  }
}

// B-bit codes (B <= 8), a thread per output byte.
__global__ void codes_kernel(const std::uint32_t* __restrict__ codes, std::uint64_t nnz,
                             unsigned bits, unsigned char* __restrict__ out, std::size_t bytes) {
  GCOMP_GRID_LOOP(o, bytes) {
    const std::uint64_t lo = 8 * static_cast<std::uint64_t>(o);
    unsigned acc = 0;
    for (std::uint64_t j = lo / bits; j < nnz && j * bits < lo + 8; ++j) {
      const std::int64_t at = static_cast<std::int64_t>(j * bits) - static_cast<std::int64_t>(lo);
      acc |= at >= 0 ? codes[j] << at : codes[j] >> (-at);
    }
    out[o] = static_cast<unsigned char>(acc & 0xffu);
  }
}

// Float values (4 bytes) or binary16 bits (2 bytes) at any alignment; the scales likewise.
__global__ void values_kernel(const std::uint32_t* __restrict__ val, std::uint64_t count,
                              bool two, unsigned char* __restrict__ out) {
  GCOMP_GRID_LOOP(j, count) {
    if (two) {
      store_u16(out + 2 * j, val[j]);
    } else {
      store_u32(out + 4 * j, val[j]);
    }
  }
}

template <class Index>
__global__ void scatter_kernel(const Index* __restrict__ idx, const float* __restrict__ val,
                               std::size_t nnz, float alpha, float* __restrict__ acc) {
  GCOMP_GRID_LOOP(j, nnz) acc[idx[j]] += alpha * val[j];  // distinct indices (checked)
}

Chunks chunks_of(const gcomp::detail::CodecImpl& codec, std::size_t n) {
  const std::uint64_t chunk = codec.params().chunk;
  Chunks s{n, chunk, codec.chunk_entries(chunk), 0, 0, 0};
  s.count = (n + chunk - 1) / chunk;
  if (n > 0) s.last = codec.chunk_entries(n - (s.count - 1) * chunk);
  s.nnz = s.count == 0 ? 0 : (s.count - 1) * s.per_chunk + s.last;
  return s;
}

template <class Index>
std::size_t encode_chunked_as(const EncodeCall& c) {
  const gcomp::detail::CodecImpl& codec = *c.codec;
  gcomp::detail::require_capacity(codec.max_bytes(c.n), c.cap);
  const gcomp::detail::CodecParams cp = codec.params();
  const Chunks s = chunks_of(codec, c.n);
  const cudaStream_t st = c.ws->stream();
  Stages stages(st, "encode", "topk_chunked", c.n);
  const std::size_t nnz = static_cast<std::size_t>(s.nnz);
  const std::size_t blocks = (nnz + kBlock - 1) / kBlock;
  std::size_t scan_bytes = 0;
  GCOMP_CUDA(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes,
                                           static_cast<unsigned long long*>(nullptr),
                                           static_cast<unsigned long long*>(nullptr),
                                           static_cast<int>(std::max<std::size_t>(1, blocks)), st));
  Carve size;
  size.take<Index>(nnz);
  size.take<std::uint32_t>(nnz);
  size.take<float>(s.count);
  size.take<unsigned char>(blocks);
  size.take<unsigned long long>(blocks);
  size.take<unsigned long long>(blocks);
  size.take<unsigned char>(scan_bytes);
  Carve place(c.ws->reserve(size.bytes()));
  Index* idx = place.take<Index>(nnz);
  std::uint32_t* val = place.take<std::uint32_t>(nnz);
  float* scales = place.take<float>(s.count);
  unsigned char* widths = place.take<unsigned char>(blocks);
  auto* block_bytes = place.take<unsigned long long>(blocks);
  auto* block_offsets = place.take<unsigned long long>(blocks);
  void* scan_temp = place.take<unsigned char>(scan_bytes);
  c.ws->reset_report();
  if (s.count > 0) {
    const unsigned grid = static_cast<unsigned>(std::min<std::uint64_t>(s.count, 65535));
    select_kernel<Index><<<grid, kThreads, 0, st>>>(c.x, c.e_old, c.e_new, s, cp.bits,
                                                    cp.fp16_values, {idx, val, scales},
                                                    c.ws->report());
    GCOMP_LAUNCHED("topk_chunked select");
  }
  stages.mark("select");
  unsigned long long last[2] = {0, 0};
  if (blocks > 0) {
    block_width_kernel<Index><<<grid_for(blocks, kThreads / 32), kThreads, 0, st>>>(
        idx, nnz, widths, block_bytes);
    GCOMP_CUDA(cub::DeviceScan::ExclusiveSum(scan_temp, scan_bytes, block_bytes, block_offsets,
                                             static_cast<int>(blocks), st));
    GCOMP_LAUNCHED("topk_chunked index widths");
    GCOMP_CUDA(cudaMemcpyAsync(&last[0], block_offsets + blocks - 1, sizeof last[0],
                               cudaMemcpyDeviceToHost, st));
    GCOMP_CUDA(cudaMemcpyAsync(&last[1], block_bytes + blocks - 1, sizeof last[1],
                               cudaMemcpyDeviceToHost, st));
  }
  finish_encode(c);
  stages.mark("widths");
  const unsigned w = static_cast<unsigned>(std::bit_width(s.chunk - 1));
  const std::size_t fixed = static_cast<std::size_t>((static_cast<unsigned __int128>(nnz) * w + 7) / 8);
  const std::size_t packed = blocks > 0 ? static_cast<std::size_t>(last[0] + last[1]) : 0;
  const bool gaps = packed < fixed;
  const std::size_t index_bytes = gaps ? packed : fixed;
  const std::size_t scale_bytes = cp.bits > 0 ? 4 * static_cast<std::size_t>(s.count) : 0;
  const std::size_t value_bytes =
      cp.bits > 0 ? (nnz * static_cast<std::size_t>(cp.bits) + 7) / 8 : nnz * (cp.fp16_values ? 2 : 4);
  std::byte params[32] = {};
  params[0] = std::byte{static_cast<unsigned char>(cp.bits > 0 ? kCodes : (cp.fp16_values ? kF16 : kF32))};
  params[1] = std::byte{static_cast<unsigned char>(gaps ? 0 : 1)};
  params[2] = static_cast<std::byte>(cp.bits);
  gcomp::detail::store_le<std::uint64_t>(params + 8, s.chunk);
  gcomp::detail::store_le<std::uint64_t>(params + 16, s.per_chunk);
  gcomp::detail::store_le<std::uint64_t>(params + 24, s.last);
  std::byte head[gcomp::detail::kMaxHeaderBytes];
  const std::byte* end = gcomp::detail::write_header(head, CodecKind::topk_chunked, c.n, params,
                                                     {index_bytes, scale_bytes, value_bytes});
  const std::size_t head_bytes = static_cast<std::size_t>(end - head);
  unsigned char* ip = put_header(c, reinterpret_cast<const unsigned char*>(head), head_bytes);
  if (nnz > 0) {
    if (gaps) {
      pack_kernel<Index><<<grid_for(blocks, kThreads / 32), kThreads, 0, st>>>(
          idx, nnz, widths, block_offsets, ip);
    } else if (index_bytes > 0) {
      relative_kernel<Index><<<grid_for(index_bytes), kThreads, 0, st>>>(idx, s, w, ip,
                                                                         index_bytes);
    }
    unsigned char* sp = ip + index_bytes;
    unsigned char* vp = sp + scale_bytes;
    if (cp.bits > 0) {
      values_kernel<<<grid_for(s.count), kThreads, 0, st>>>(
          reinterpret_cast<const std::uint32_t*>(scales), s.count, false, sp);
      codes_kernel<<<grid_for(value_bytes), kThreads, 0, st>>>(
          val, nnz, static_cast<unsigned>(cp.bits), vp, value_bytes);
    } else {
      values_kernel<<<grid_for(nnz), kThreads, 0, st>>>(val, nnz, cp.fp16_values, vp);
    }
    GCOMP_LAUNCHED("topk_chunked emit");
  }
  c.ws->finish();
  stages.mark("emit");
  return head_bytes + index_bytes + scale_bytes + value_bytes;
}

std::size_t encode_chunked(const EncodeCall& c) {
  if (gcomp::detail::index_width(c.n) == 4) return encode_chunked_as<std::uint32_t>(c);
  return encode_chunked_as<std::uint64_t>(c);
}

template <class Index>
void scatter_as(const gcomp::SparseEntries& e, const DecodeCall& d) {
  const std::size_t nnz = e.indices.size();
  std::vector<Index> idx(e.indices.begin(), e.indices.end());
  Carve size;
  size.take<Index>(nnz);
  size.take<float>(nnz);
  Carve place(d.ws->reserve(size.bytes()));
  Index* di = place.take<Index>(nnz);
  float* dv = place.take<float>(nnz);
  const cudaStream_t s = d.ws->stream();
  GCOMP_CUDA(cudaMemcpyAsync(di, idx.data(), nnz * sizeof(Index), cudaMemcpyHostToDevice, s));
  GCOMP_CUDA(cudaMemcpyAsync(dv, e.values.data(), nnz * sizeof(float), cudaMemcpyHostToDevice, s));
  scatter_kernel<Index><<<grid_for(nnz), kThreads, 0, s>>>(di, dv, nnz, d.alpha, d.acc);
  GCOMP_LAUNCHED("topk_chunked decode_add");
  GCOMP_CUDA(cudaStreamSynchronize(s));  // the host vectors go out of scope
}

void decode_chunked(const DecodeCall& d) {
  if (!d.apply) check_size(d);  // the CPU's order: past the layout, the size first
  Stages stages(d.ws->stream(), "decode_add", "topk_chunked", d.p.n);
  gcomp::detail::Payload hp = d.p;
  std::vector<std::byte> sections[gcomp::detail::kMaxSections];
  for (std::size_t i = 0; i < d.p.section_count; ++i) {
    sections[i].resize(static_cast<std::size_t>(d.p.sections[i].size));
    if (!sections[i].empty()) {
      GCOMP_CUDA(cudaMemcpyAsync(sections[i].data(), d.sections[i], sections[i].size(),
                                 cudaMemcpyDeviceToHost, d.ws->stream()));
    }
    hp.sections[i].data = sections[i].data();
  }
  GCOMP_CUDA(cudaStreamSynchronize(d.ws->stream()));
  stages.mark("to_host");
  gcomp::SparseEntries e;
  gcomp::detail::read_sparse_entries(hp, e, false);  // every check, the CPU's messages
  stages.mark("check_on_host");
  if (e.indices.empty()) return;
  if (gcomp::detail::index_width(d.p.n) == 4) {
    scatter_as<std::uint32_t>(e, d);
  } else {
    scatter_as<std::uint64_t>(e, d);
  }
  stages.mark("scatter");
}

}  // namespace

std::span<const DeviceCodec> chunked_device_codecs() {
  static const DeviceCodec list[] = {{CodecKind::topk_chunked, encode_chunked, decode_chunked}};
  return list;
}

}  // namespace gcomp::cuda::detail
