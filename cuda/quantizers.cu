// sign, TernGrad and QSGD on the device (compressors/sign.cpp, terngrad.cpp, qsgd.cpp), byte for
// byte as the CPU:
//
//   * statistics in the canonical order of compressors/reduce.hpp: 16 threads of a half-warp own
//     the 16 double lanes of one block of 4096 elements (or one QSGD bucket), lane j summing the
//     elements j, j + 16, ... in turn; the lanes fold by shuffles (w = 8, 4, 2, 1); block sums
//     fold pairwise in one CUDA block (tree_sum_block);
//   * random draws: thread t of a 256-thread tile computes Philox block base / 8 + t, whose four
//     words are the 16-bit draws of the elements 64 g + 16 w + 2 j + {0, 1} (g = t / 8,
//     j = t % 8), the layout of compressors/philox.hpp;
//   * codes go to shared memory as bytes, and each thread packs 8 of them into B whole bytes.
//
// Error feedback is fused as on the CPU: the statistics pass writes v = x + e into e_new, the
// code pass overwrites it with v - decode. QSGD with buckets that tile the code tile (the
// default 512) takes its norms and codes in one pass instead (qsgd_fused_kernel), e_new getting
// v - decode at once.
#include <cfloat>
#include <string>

#include "bytes.hpp"
#include "codecs.cuh"
#include "rounding.hpp"

namespace gcomp::cuda::detail {

using gcomp::detail::QsgdScale;
using gcomp::detail::Ternary;

namespace {

constexpr unsigned kTile = 2048;  // elements per code tile: 256 threads x 8
constexpr std::size_t kStatsBatch = 16;  // rows per lane in flight in the statistics

// ---- statistics of 4096-element blocks (sign, TernGrad) ----

struct BlockOut {
  double* s1;         // sum of |v| (sign) or of v (TernGrad)
  double* s2;         // sum of v^2 (TernGrad)
  std::uint32_t* mx;  // max |v| as bits (TernGrad)
};

// One half-warp's run of a block: its lanes' sums in the canonical order, kStatsBatch rows
// (loads) in flight per lane. Full: the run is a whole block, so no load needs a guard: guarded
// loads each hold a predicate register until their use, and with 7 of those the compiler kept
// at most about 8 loads in flight (the H200 read the statistics at 36% of the copy's rate).
template <bool EF, bool Sign, bool Full>
__device__ __forceinline__ void stats_run(const float* __restrict__ x,
                                          const float* __restrict__ e_old,
                                          float* __restrict__ e_new, std::size_t start,
                                          std::size_t len, unsigned char* __restrict__ bits,
                                          double& a1, double& a2, std::uint32_t& mx) {
  const unsigned lane = threadIdx.x & 31u;
  const unsigned j = lane & 15u;
  constexpr std::size_t kBatch = kStatsBatch;
  for (std::size_t it0 = 0; it0 < kReduceBlock / 16; it0 += kBatch) {
    float xs[kBatch];
    float es[kBatch];
#pragma unroll
    for (std::size_t u = 0; u < kBatch; ++u) {
      const std::size_t m = 16 * (it0 + u) + j;
      if (Full || m < len) {
        xs[u] = x[start + m];
        if (EF) es[u] = e_old[start + m];
      }
    }
#pragma unroll
    for (std::size_t u = 0; u < kBatch; ++u) {
      const std::size_t it = it0 + u;
      const std::size_t m = 16 * it + j;
      const bool valid = Full || m < len;
      float v = 0.0f;
      if (valid) {
        v = xs[u];
        if (EF) {
          v = v + es[u];
          e_new[start + m] = v;
        }
        if (Sign) {
          a1 = a1 + static_cast<double>(fabsf(v));
        } else {
          a1 = a1 + static_cast<double>(v);
          a2 = a2 + static_cast<double>(v) * static_cast<double>(v);
          const std::uint32_t b = __float_as_uint(v) & 0x7fffffffu;
          mx = b > mx ? b : mx;
        }
      }
      if (Sign) {
        const unsigned ballot = __ballot_sync(0xffffffffu, valid && v < 0.0f);
        const unsigned mine = (ballot >> (lane & 16u)) & 0xffffu;
        if (j == 0 && valid) {
          unsigned char* o = bits + (start + 16 * it) / 8;
          o[0] = static_cast<unsigned char>(mine);
          if (Full || 16 * it + 8 < len) o[1] = static_cast<unsigned char>(mine >> 8);
        }
      }
    }
  }
}

// Warp w handles blocks 2w and 2w + 1 (one per half-warp); with EF, v = x + e goes to e_new.
// Sign also writes its bits here: a ballot of v < 0 over the 16 consecutive elements a half-warp
// reads at once.
template <bool EF, bool Sign>
__global__ void block_stats_kernel(const float* __restrict__ x, const float* __restrict__ e_old,
                                   float* __restrict__ e_new, std::size_t n, std::size_t blocks,
                                   unsigned char* __restrict__ bits, BlockOut out) {
  const unsigned j = threadIdx.x & 15u;
  for (std::size_t w = first_warp(); 2 * w < blocks; w += warp_count()) {
    const HalfWarpRun run = half_warp_run(w, blocks, kReduceBlock, n);
    double a1 = 0.0;
    double a2 = 0.0;
    std::uint32_t mx = 0;
    // The same path for both half-warps (sign's ballots take the whole warp).
    if (__all_sync(0xffffffffu, run.len == kReduceBlock)) {
      stats_run<EF, Sign, true>(x, e_old, e_new, run.start, run.len, bits, a1, a2, mx);
    } else {
      stats_run<EF, Sign, false>(x, e_old, e_new, run.start, run.len, bits, a1, a2, mx);
    }
    a1 = fold16(a1);
    if (!Sign) {
      a2 = fold16(a2);
      for (int s = 8; s >= 1; s /= 2) {
        const std::uint32_t o = __shfl_down_sync(0xffffffffu, mx, s, 16);
        mx = o > mx ? o : mx;
      }
    }
    if (j == 0 && run.have) {
      out.s1[run.index] = a1;
      if (!Sign) {
        out.s2[run.index] = a2;
        out.mx[run.index] = mx;
      }
    }
  }
}

// ---- sign ----

// One block: scale = mean |v| from the block sums; non-finite input shows as a non-finite total.
__global__ void __launch_bounds__(1024) sign_finish_kernel(double* s1, double* tmp, std::size_t blocks, std::size_t n,
                                   unsigned char* scale_out, float* scale, Report* r) {
  __shared__ double total;
  tree_sum_block(s1, tmp, blocks, &total);
  if (threadIdx.x != 0) return;
  if (!isfinite(total)) {
    report_nonfinite(r);
    *scale = 0.0f;
    return;
  }
  const float sc = n > 0 ? static_cast<float>(total / static_cast<double>(n)) : 0.0f;
  *scale = sc;
  store_u32(scale_out, __float_as_uint(sc));
}

__global__ void sign_residual_kernel(float* __restrict__ e_new, std::size_t n,
                                     const float* __restrict__ scale, const Report* r) {
  if (r->code != 0) return;
  const float sc = *scale;
  GCOMP_GRID_ROUNDS(i0, stride, n) {
    float v[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      if (i0 + k * stride < n) v[k] = e_new[i0 + k * stride];
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      if (i0 + k * stride < n) e_new[i0 + k * stride] = v[k] - (v[k] < 0 ? -sc : sc);
    }
  }
}

__global__ void sign_validate_kernel(const unsigned char* scale, const unsigned char* bits,
                                     std::size_t n, std::size_t bytes, Report* r) {
  const std::uint32_t s = load_u32(scale);
  if ((s & kInfBits) == kInfBits || (s >> 31) != 0) report_bad(r, 0);
  const unsigned tail = static_cast<unsigned>(n & 7);
  if (tail != 0 && bytes != 0 && (bits[bytes - 1] >> tail) != 0) report_bad(r, 1);
}

__global__ void sign_decode_kernel(const unsigned char* __restrict__ scale,
                                   const unsigned char* __restrict__ bits, std::size_t n,
                                   float* __restrict__ acc, float alpha, const Report* r) {
  if (r->code != 0) return;
  const float plus = alpha * __uint_as_float(load_u32(scale));
  GCOMP_GRID_ROUNDS(i0, stride, n) {
    unsigned b[kUnroll];
    float a[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const std::size_t i = i0 + k * stride;
      if (i < n) {
        b[k] = bits[i >> 3];
        a[k] = acc[i];
      }
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const std::size_t i = i0 + k * stride;
      if (i < n) acc[i] = a[k] + (((b[k] >> (i & 7)) & 1u) ? -plus : plus);
    }
  }
}

// ---- codes with random draws (TernGrad, QSGD) ----

// The Philox key of one encode's draws: the seed's two halves and the codec (its counter is
// the element or block index).
struct DrawKey {
  std::uint32_t k0, k1, codec;
};

// The block statistics pass of sign (with its bits) or TernGrad, with or without error feedback.
template <bool Sign>
void launch_block_stats(const EncodeCall& c, std::size_t blocks, unsigned char* bits,
                        const BlockOut& st) {
  const unsigned grid = grid_for(blocks * 16);
  const cudaStream_t s = c.ws->stream();
  if (c.e_old) {
    block_stats_kernel<true, Sign>
        <<<grid, kThreads, 0, s>>>(c.x, c.e_old, c.e_new, c.n, blocks, bits, st);
  } else {
    block_stats_kernel<false, Sign>
        <<<grid, kThreads, 0, s>>>(c.x, nullptr, nullptr, c.n, blocks, bits, st);
  }
  GCOMP_LAUNCHED(Sign ? "sign statistics" : "terngrad statistics");
}

DrawKey draw_key_of(std::uint64_t seed, CodecKind kind) {
  return {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32),
          static_cast<std::uint32_t>(kind)};
}

// The thread's eight values of tile `tl` (elements 64 g + 16 w + 2 j + h). A whole tile needs
// no guards (each guarded load would hold a predicate register until its use).
__device__ __forceinline__ void load_tile_values(const float* src, std::size_t n, std::size_t tl,
                                                 unsigned g, unsigned j, float (&vs)[8]) {
  const std::size_t base = tl * kTile;
  if (base + kTile <= n) {
#pragma unroll
    for (unsigned w = 0; w < 4; ++w) {
#pragma unroll
      for (unsigned h = 0; h < 2; ++h) vs[2 * w + h] = src[base + 64 * g + 16 * w + 2 * j + h];
    }
  } else {
#pragma unroll
    for (unsigned w = 0; w < 4; ++w) {
#pragma unroll
      for (unsigned h = 0; h < 2; ++h) {
        const std::size_t i = base + 64 * g + 16 * w + 2 * j + h;
        if (i < n) vs[2 * w + h] = src[i];
      }
    }
  }
}

// The codes of one thread's eight elements of a tile into the shared tile (and with error
// feedback v - decoded into ef).
template <class Coder>
__device__ __forceinline__ void code_values(const Coder& coder, const float (&vs)[8],
                                            std::size_t base, std::size_t n, unsigned g,
                                            unsigned j, const std::uint32_t (&words)[4],
                                            float* ef, unsigned char* tile) {
#pragma unroll
  for (unsigned w = 0; w < 4; ++w) {
#pragma unroll
    for (unsigned h = 0; h < 2; ++h) {
      const unsigned off = 64 * g + 16 * w + 2 * j + h;
      const std::size_t i = base + off;
      std::uint32_t code = 0;
      if (i < n) {
        const std::uint32_t draw = h ? (words[w] >> 16) : (words[w] & 0xffffu);
        const float v = vs[2 * w + h];
        float dec;
        code = coder(i, v, draw, &dec);
        if (ef) ef[i] = v - dec;
      }
      tile[off] = static_cast<unsigned char>(code);
    }
  }
}

// Thread t's eight codes of a tile (bytes 8 t.. of `tile`), `bits` each, packed into its `bits`
// bytes of the payload (cut at code_bytes). Staging the tile's bytes in shared memory for
// stores of consecutive words, and storing a thread's bytes in one wide store, were both slower
// or no faster on an H200 (docs/results.md, runs 12 and 13).
__device__ __forceinline__ void store_codes(const unsigned char* tile, int bits, std::size_t base,
                                            unsigned char* __restrict__ codes,
                                            std::size_t code_bytes) {
  const unsigned t = threadIdx.x;
  unsigned long long packed = 0;
#pragma unroll
  for (unsigned k = 0; k < 8; ++k) {
    packed |= static_cast<unsigned long long>(tile[8 * t + k]) << (k * bits);
  }
  const std::size_t first = (base / 8 + t) * static_cast<std::size_t>(bits);
  for (int b = 0; b < bits; ++b) {
    if (first + b < code_bytes) codes[first + b] = static_cast<unsigned char>(packed >> (8 * b));
  }
}

// Q::at(first, last) gives the coder of one thread's elements in [first, last]:
// std::uint32_t operator()(std::size_t i, float v, std::uint32_t draw16, float* decoded), and
// when `shared` (they share their constants, loaded once) fast(), the same without a lookup.
// src is x, or e_new holding v with error feedback (then ef == e_new gets v - decoded): each
// element is read before it is written. (Prefetching the next tile's values during this one's codes, on a grid of resident
// blocks, made TernGrad's and QSGD's codes 7-9% slower on an H200: they are bound by the codes'
// arithmetic, not by loads in flight.)
template <class Q>
__global__ void codes_kernel(Q q, int bits, const float* src, float* ef, std::size_t n, DrawKey st,
                             unsigned char* __restrict__ codes, std::size_t code_bytes,
                             const Report* r) {
  __shared__ unsigned char tile[kTile];
  if (r->code != 0) return;
  const unsigned t = threadIdx.x;
  const unsigned g = t >> 3;
  const unsigned j = t & 7u;
  const std::size_t tiles = (n + kTile - 1) / kTile;
  for (std::size_t tl = blockIdx.x; tl < tiles; tl += gridDim.x) {
    const std::size_t base = tl * kTile;
    float vs[8];
    load_tile_values(src, n, tl, g, j, vs);
    const std::size_t mine = base + 64 * g;  // the thread's elements lie in [mine, mine + 63]
    const auto coder = q.at(mine, (mine + 63 < n ? mine + 63 : n - 1));
    const uint4 r4 = philox_block(st.k0, st.k1, st.codec, base / 8 + t);
    const std::uint32_t words[4] = {r4.x, r4.y, r4.z, r4.w};
    // Elements that share their coder's constants (one QSGD bucket) take the path without a
    // per-element lookup, chosen once per thread.
    if (coder.shared) {
      code_values(coder.fast(), vs, base, n, g, j, words, ef, tile);
    } else {
      code_values(coder, vs, base, n, g, j, words, ef, tile);
    }
    __syncthreads();
    store_codes(tile, bits, base, codes, code_bytes);
    __syncthreads();
  }
}

// ---- TernGrad ----

struct TernQ {
  const Ternary* t;
  struct Coder {
    Ternary t;
    bool shared = true;
    __device__ std::uint32_t operator()(std::size_t, float v, std::uint32_t draw,
                                        float* decoded) const {
      return gcomp::detail::ternary_code(t, v, draw, decoded);
    }
    __device__ const Coder& fast() const { return *this; }
  };
  __device__ Coder at(std::size_t, std::size_t) const { return Coder{*t}; }
};

// One block: sigma, the clip bound and the scaler s, exactly as TernGradCodec::encode. The
// maximum is order-free (warp maxima, then the block's); the two sums fold level by level
// together.
constexpr unsigned kFinishThreads = 1024;
__global__ void __launch_bounds__(kFinishThreads)
    tern_finish_kernel(BlockOut in, double* tmp1, double* tmp2, std::size_t blocks, std::size_t n,
                       double clip, unsigned char* s_out, Ternary* t, Report* r) {
  __shared__ std::uint32_t maxes[kFinishThreads / 32];
  __shared__ double total;
  __shared__ double total_sq;
  const std::uint32_t* __restrict__ mxs = in.mx;
  std::uint32_t mx = 0;
#pragma unroll 8
  for (std::size_t b = threadIdx.x; b < blocks; b += blockDim.x) mx = mxs[b] > mx ? mxs[b] : mx;
  for (int o = 16; o >= 1; o /= 2) {
    const std::uint32_t other = __shfl_down_sync(0xffffffffu, mx, o);
    mx = other > mx ? other : mx;
  }
  if ((threadIdx.x & 31u) == 0) maxes[threadIdx.x / 32] = mx;
  tree_sum_block2(in.s1, tmp1, in.s2, tmp2, blocks, &total, &total_sq);  // its barriers order maxes
  if (threadIdx.x != 0) return;
  for (unsigned k = 1; k < blockDim.x / 32; ++k) mx = maxes[k] > mx ? maxes[k] : mx;
  if (mx >= kInfBits) {
    report_nonfinite(r);
    return;
  }
  const Ternary out = gcomp::detail::terngrad_scale(total, total_sq, n, clip, __uint_as_float(mx));
  *t = out;
  store_u32(s_out, __float_as_uint(out.s));
}

__global__ void tern_validate_kernel(const unsigned char* s, const unsigned char* codes,
                                     std::size_t n, std::size_t bytes, Report* r) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    const std::uint32_t u = load_u32(s);
    if ((u & kInfBits) == kInfBits || (u >> 31) != 0) report_bad(r, 0);
    const unsigned tail = static_cast<unsigned>((2 * n) & 7);
    if (tail != 0 && bytes != 0 && (codes[bytes - 1] >> tail) != 0) report_bad(r, 2);
  }
  GCOMP_GRID_ROUNDS(k0, stride, bytes) {
    unsigned b[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (k0 + u * stride < bytes) b[u] = codes[k0 + u * stride];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const std::size_t k = k0 + u * stride;
      if (k < bytes && (b[u] & (b[u] >> 1) & 0x55u) != 0) report_bad(r, 1, k);
    }
  }
}

__global__ void tern_decode_kernel(const unsigned char* __restrict__ s,
                                   const unsigned char* __restrict__ codes, std::size_t n,
                                   float* __restrict__ acc, float alpha, const Report* r) {
  if (r->code != 0) return;
  const float plus = alpha * __uint_as_float(load_u32(s));
  GCOMP_GRID_ROUNDS(i0, stride, n) {
    unsigned c[kUnroll];
    float a[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const std::size_t i = i0 + k * stride;
      if (i < n) {
        c[k] = (codes[i >> 2] >> (2 * (i & 3))) & 3u;
        a[k] = acc[i];
      }
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const std::size_t i = i0 + k * stride;
      if (i >= n) continue;
      if (c[k] == 1) acc[i] = a[k] + plus;
      if (c[k] == 2) acc[i] = a[k] + -plus;
    }
  }
}

// ---- QSGD ----

// Half-warp per bucket: the canonical sum of squares, the norm (saturating at 2^127) and the
// constants of quantize_one; with EF, v = x + e into e_new.
template <bool EF>
__global__ void qsgd_norm_kernel(const float* __restrict__ x, const float* __restrict__ e_old,
                                 float* __restrict__ e_new, std::size_t n, std::size_t bucket,
                                 std::size_t buckets, float levels, QsgdScale* __restrict__ out,
                                 unsigned char* __restrict__ norms, Report* r) {
  const unsigned j = threadIdx.x & 15u;
  for (std::size_t w = first_warp(); 2 * w < buckets; w += warp_count()) {
    const HalfWarpRun run = half_warp_run(w, buckets, bucket, n);
    const std::size_t b = run.index;
    const bool have = run.have;
    const std::size_t start = run.start;
    const std::size_t len = run.len;
    double a = 0.0;
    // kBatch loads in flight per lane, then the sum in the canonical order.
    constexpr std::size_t kBatch = 8;
    for (std::size_t m0 = j; m0 < len; m0 += 16 * kBatch) {
      float xs[kBatch];
      float es[kBatch];
#pragma unroll
      for (std::size_t u = 0; u < kBatch; ++u) {
        const std::size_t m = m0 + 16 * u;
        if (m < len) {
          xs[u] = x[start + m];
          if (EF) es[u] = e_old[start + m];
        }
      }
#pragma unroll
      for (std::size_t u = 0; u < kBatch; ++u) {
        const std::size_t m = m0 + 16 * u;
        if (m >= len) break;
        float v = xs[u];
        if (EF) {
          v = v + es[u];
          e_new[start + m] = v;
        }
        a = a + static_cast<double>(v) * static_cast<double>(v);
      }
    }
    a = fold16(a);
    if (j == 0 && have && !isfinite(a)) report_nonfinite(r);
    if (j == 0 && have && isfinite(a)) {
      const float norm = gcomp::detail::qsgd_norm(a);
      out[b] = gcomp::detail::qsgd_scale(levels, norm);
      store_u32(norms + 4 * b, __float_as_uint(norm));
    }
  }
}

struct QsgdQ {
  const QsgdScale* buckets;
  std::size_t bucket;
  float levels;
  int bits;
  bool narrow;  // n < 2^32: 32-bit division finds the bucket
  __device__ std::size_t bucket_of(std::size_t i) const {
    return narrow ? static_cast<std::uint32_t>(i) / static_cast<std::uint32_t>(bucket) : i / bucket;
  }
  // Elements in one bucket (the usual case: buckets of a multiple of 64 elements) share its
  // scale, found once; else each element finds its own.
  struct Coder;
  // [first, last] within [0, n), or empty (last < first: the thread has no element).
  __device__ Coder at(std::size_t first, std::size_t last) const;
};

struct QsgdQ::Coder {
  QsgdQ q;
  QsgdScale scale;
  bool shared;
  // Each element finds its bucket.
  __device__ std::uint32_t operator()(std::size_t i, float v, std::uint32_t draw,
                                      float* decoded) const {
    return gcomp::detail::qsgd_code(q.buckets[q.bucket_of(i)], q.levels, q.bits, v, draw,
                                    decoded);
  }
  // All of the thread's elements are in the one bucket whose scale is held.
  struct Shared {
    QsgdScale scale;
    float levels;
    int bits;
    __device__ std::uint32_t operator()(std::size_t, float v, std::uint32_t draw,
                                        float* decoded) const {
      return gcomp::detail::qsgd_code(scale, levels, bits, v, draw, decoded);
    }
  };
  __device__ Shared fast() const { return Shared{scale, q.levels, q.bits}; }
};

__device__ QsgdQ::Coder QsgdQ::at(std::size_t first, std::size_t last) const {
  const std::size_t b = bucket_of(first);
  const bool shared = first <= last && last < (b + 1) * bucket;
  return Coder{*this, shared ? buckets[b] : QsgdScale{}, shared};
}

// Norms and codes in one pass over the tensor where the buckets tile the code tile (a bucket a
// multiple of 64 that divides kTile; the default 512 is): a block loads its tile (with EF, v = x
// + e) once, into registers in the draws' layout and into shared memory, from which half-warps
// take the canonical sums of squares of the tile's buckets (lane j the elements j, j + 16, ...
// in turn, then fold16, as qsgd_norm_kernel); then each thread codes its eight elements (all in
// one bucket) from registers. Two passes read 1 GiB of a 256M tensor twice (the norms alone
// took 0.27 ms of 0.94 on an H200). With EF, e_new gets v - decoded directly.
template <bool EF>
__global__ void __launch_bounds__(kThreads)
    qsgd_fused_kernel(const float* __restrict__ x, const float* __restrict__ e_old,
                      float* __restrict__ e_new, std::size_t n, std::size_t bucket,
                      std::size_t buckets, float levels, int bits, DrawKey st,
                      unsigned char* __restrict__ norms, unsigned char* __restrict__ codes,
                      std::size_t code_bytes, Report* r) {
  __shared__ float values[kTile];
  __shared__ QsgdScale scales[kTile / 64];
  __shared__ unsigned char tile[kTile];
  const unsigned t = threadIdx.x;
  const unsigned g = t >> 3;
  const unsigned j = t & 7u;
  const unsigned lane16 = t & 15u;
  const unsigned half = t >> 4;
  const unsigned warp = t >> 5;
  const unsigned per_tile = static_cast<unsigned>(kTile / bucket);
  const std::size_t tiles = (n + kTile - 1) / kTile;
  for (std::size_t tl = blockIdx.x; tl < tiles; tl += gridDim.x) {
    const std::size_t base = tl * kTile;
    float vs[8];
    load_tile_values(x, n, tl, g, j, vs);
    if (EF) {
      float es[8];
      load_tile_values(e_old, n, tl, g, j, es);
#pragma unroll
      for (unsigned k = 0; k < 8; ++k) vs[k] = vs[k] + es[k];
    }
#pragma unroll
    for (unsigned w = 0; w < 4; ++w) {
#pragma unroll
      for (unsigned h = 0; h < 2; ++h) values[64 * g + 16 * w + 2 * j + h] = vs[2 * w + h];
    }
    __syncthreads();
    // Half-warp `half` sums the tile's buckets half, half + 16, ...; a warp whose first
    // half-warp has none is done (the same for its 32 lanes, which fold16 needs).
    for (unsigned r0 = 0; r0 + 2 * warp < per_tile; r0 += 16) {
      const unsigned bb = r0 + half;
      const std::size_t b = tl * per_tile + bb;
      const bool have = bb < per_tile && b < buckets;
      const std::size_t len = have ? (n - b * bucket < bucket ? n - b * bucket : bucket) : 0;
      double a = 0.0;
      for (std::size_t m = lane16; m < len; m += 16) {
        const float v = values[bb * bucket + m];
        a = a + static_cast<double>(v) * static_cast<double>(v);
      }
      a = fold16(a);
      if (lane16 == 0 && have) {
        if (!isfinite(a)) {
          report_nonfinite(r);
          scales[bb] = QsgdScale{};
        } else {
          const float norm = gcomp::detail::qsgd_norm(a);
          scales[bb] = gcomp::detail::qsgd_scale(levels, norm);
          store_u32(norms + 4 * b, __float_as_uint(norm));
        }
      }
    }
    __syncthreads();
    const uint4 r4 = philox_block(st.k0, st.k1, st.codec, base / 8 + t);
    const std::uint32_t words[4] = {r4.x, r4.y, r4.z, r4.w};
    const QsgdQ::Coder::Shared coder{scales[(64 * g) / bucket], levels, bits};
    code_values(coder, vs, base, n, g, j, words, EF ? e_new : nullptr, tile);
    __syncthreads();
    store_codes(tile, bits, base, codes, code_bytes);
    __syncthreads();  // values, scales and tile are the next tile's
  }
}

// Also each bucket's step, norm / levels, for the decode: the same division the decode would do
// for each of the bucket's elements, done once.
__global__ void qsgd_validate_kernel(const unsigned char* norms, std::size_t buckets,
                                     const unsigned char* codes, std::size_t code_bytes,
                                     std::uint64_t used_bits, float levels, float* steps,
                                     Report* r) {
  GCOMP_GRID_LOOP(b, buckets) {
    const std::uint32_t u = load_u32(norms + 4 * b);
    if ((u & kInfBits) == kInfBits || (u >> 31) != 0) report_bad(r, 0, b);
    steps[b] = __uint_as_float(u) / levels;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    const unsigned tail = static_cast<unsigned>(used_bits & 7);
    if (tail != 0 && code_bytes != 0 && (codes[code_bytes - 1] >> tail) != 0) report_bad(r, 1);
  }
}

// Thread by group of 8 elements, whose codes are `bits` whole bytes: the bytes once, the step
// once per group where the group lies in one bucket, and with Vec (acc 16-byte aligned) the
// accumulator as two 16-byte loads and stores. Each element gets the operations of the CPU's
// decode: acc + alpha * (+-step * level).
//
// A round whose groups are all whole (8 elements, `bits` bytes) needs no guards, and with the
// width B known at compile time (2, 4 or 8; 0: the runtime `bits`) its byte loads are a fixed
// number: guarded loads each hold a predicate register until their use, which kept few loads in
// flight. Every load of a round is issued before the first is used.
constexpr int kDecodeGroups = 2;  // groups per thread and round (64 bytes of acc in flight)
template <int B, bool Vec>
__global__ void qsgd_decode_kernel(const float* __restrict__ steps,
                                   const unsigned char* __restrict__ codes, std::size_t n,
                                   std::size_t bucket, int bits_at_run, float alpha,
                                   float* __restrict__ acc, const Report* r) {
  if (r->code != 0) return;
  const int bits = B > 0 ? B : bits_at_run;
  const std::uint32_t level_mask = (1u << (bits - 1)) - 1;
  const std::uint32_t code_mask = (1u << bits) - 1;
  const bool narrow = n < (std::size_t{1} << 32);  // 32-bit division finds the bucket
  const auto bucket_of = [&](std::size_t i) -> std::size_t {
    return narrow ? static_cast<std::uint32_t>(i) / static_cast<std::uint32_t>(bucket) : i / bucket;
  };
  // The 8 decoded values of group `first` from its code word, into out.
  const auto decode8 = [&](std::uint64_t word, std::size_t first, std::size_t count, bool one,
                           float step, const float (&a)[8], float (&out)[8]) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if (static_cast<std::size_t>(e) >= count) continue;
      const std::uint32_t c = static_cast<std::uint32_t>(word >> (bits * e)) & code_mask;
      const float st = one ? step : steps[bucket_of(first + e)];
      const float d = st * static_cast<float>(c & level_mask);
      out[e] = a[e] + alpha * ((c >> (bits - 1)) ? -d : d);
    }
  };
  const std::size_t groups = (n + 7) / 8;
  const std::size_t whole = n / 8;  // groups of 8 elements, all of whose bytes are there
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t g0 = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
       g0 < groups; g0 += kDecodeGroups * stride) {
    if (g0 + (kDecodeGroups - 1) * stride < whole) {
      unsigned char raw[kDecodeGroups][8];
      float a[kDecodeGroups][8];
      float step[kDecodeGroups];
      bool one[kDecodeGroups];
#pragma unroll
      for (int k = 0; k < kDecodeGroups; ++k) {
        const std::size_t g = g0 + k * stride;
        const unsigned char* p = codes + g * static_cast<std::size_t>(bits);
        if (B > 0) {
#pragma unroll
          for (int b = 0; b < (B > 0 ? B : 1); ++b) raw[k][b] = p[b];
        } else {
#pragma unroll
          for (int b = 0; b < 8; ++b) {
            if (b < bits) raw[k][b] = p[b];
          }
        }
        const std::size_t b0 = bucket_of(8 * g);
        one[k] = 8 * g + 7 < (b0 + 1) * bucket;
        step[k] = steps[b0];
        if (Vec) {
          const float4 lo = reinterpret_cast<const float4*>(acc + 8 * g)[0];
          const float4 hi = reinterpret_cast<const float4*>(acc + 8 * g)[1];
          a[k][0] = lo.x; a[k][1] = lo.y; a[k][2] = lo.z; a[k][3] = lo.w;
          a[k][4] = hi.x; a[k][5] = hi.y; a[k][6] = hi.z; a[k][7] = hi.w;
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) a[k][e] = acc[8 * g + e];
        }
      }
#pragma unroll
      for (int k = 0; k < kDecodeGroups; ++k) {
        const std::size_t g = g0 + k * stride;
        std::uint64_t word = 0;
#pragma unroll
        for (int b = 0; b < 8; ++b) {
          if (b < bits) word |= static_cast<std::uint64_t>(raw[k][b]) << (8 * b);
        }
        float out[8];
        decode8(word, 8 * g, 8, one[k], step[k], a[k], out);
        if (Vec) {
          reinterpret_cast<float4*>(acc + 8 * g)[0] = make_float4(out[0], out[1], out[2], out[3]);
          reinterpret_cast<float4*>(acc + 8 * g)[1] = make_float4(out[4], out[5], out[6], out[7]);
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[8 * g + e] = out[e];
        }
      }
      continue;
    }
    // The round with the last group, which may be short (its bytes end with the payload).
#pragma unroll 1
    for (int k = 0; k < kDecodeGroups; ++k) {
      const std::size_t g = g0 + k * stride;
      if (g >= groups) continue;
      const std::size_t first = 8 * g;
      const std::size_t count = n - first < 8 ? n - first : 8;
      const unsigned char* p = codes + g * static_cast<std::size_t>(bits);
      const std::size_t nbytes = (count * static_cast<std::size_t>(bits) + 7) / 8;
      std::uint64_t word = 0;
      for (std::size_t b = 0; b < nbytes; ++b) word |= static_cast<std::uint64_t>(p[b]) << (8 * b);
      const std::size_t b0 = bucket_of(first);
      float a[8];
      for (std::size_t e = 0; e < count; ++e) a[e] = acc[first + e];
      float out[8];
      decode8(word, first, count, first + count - 1 < (b0 + 1) * bucket, steps[b0], a, out);
      for (std::size_t e = 0; e < count; ++e) acc[first + e] = out[e];
    }
  }
}

template <int B>
void launch_qsgd_decode(const DecodeCall& d, const float* steps, std::size_t n,
                        std::size_t bucket, int bits, cudaStream_t s) {
  const unsigned grid = grid_for((n + 7) / 8, std::uint64_t{kThreads} * kDecodeGroups);
  if (reinterpret_cast<std::uintptr_t>(d.acc) % 16 == 0) {
    qsgd_decode_kernel<B, true><<<grid, kThreads, 0, s>>>(steps, d.sections[1], n, bucket, bits,
                                                          d.alpha, d.acc, d.ws->report());
  } else {
    qsgd_decode_kernel<B, false><<<grid, kThreads, 0, s>>>(steps, d.sections[1], n, bucket, bits,
                                                           d.alpha, d.acc, d.ws->report());
  }
}

std::size_t blocks_of(std::size_t n) { return (n + kReduceBlock - 1) / kReduceBlock; }

unsigned char* header_for(const EncodeCall& c, const std::byte* params,
                          std::initializer_list<std::uint64_t> sections) {
  std::byte head[gcomp::detail::kMaxHeaderBytes];
  const std::byte* end = gcomp::detail::write_header(head, c.codec->kind(), c.n, params, sections);
  return put_header(c, reinterpret_cast<const unsigned char*>(head),
                    static_cast<std::size_t>(end - head));
}

std::size_t encode_sign(const EncodeCall& c) {
  const std::size_t need = c.codec->max_bytes(c.n);
  gcomp::detail::require_capacity(need, c.cap);
  const std::size_t bytes = (c.n + 7) / 8;
  unsigned char* data = header_for(c, nullptr, {4, bytes});
  const std::size_t blocks = blocks_of(c.n);
  Carve size;
  size.take<double>(blocks);
  size.take<double>(blocks);
  size.take<float>(1);
  Carve carve(c.ws->reserve(size.bytes()));
  BlockOut st{carve.take<double>(blocks), nullptr, nullptr};
  double* tmp = carve.take<double>(blocks);
  float* scale = carve.take<float>(1);
  const cudaStream_t s = c.ws->stream();
  Stages stages(s, "encode", "sign", c.n);
  c.ws->reset_report();
  if (c.n > 0) launch_block_stats<true>(c, blocks, data + 4, st);
  stages.mark("stats");
  sign_finish_kernel<<<1, 1024, 0, s>>>(st.s1, tmp, blocks, c.n, data, scale, c.ws->report());
  GCOMP_LAUNCHED("sign scale");
  stages.mark("scale");
  if (c.e_old && c.n > 0) {
    sign_residual_kernel<<<grid_for_rounds(c.n), kThreads, 0, s>>>(c.e_new, c.n, scale,
                                                                   c.ws->report());
    GCOMP_LAUNCHED("sign residual");
    stages.mark("residual");
  }
  if (c.ws->finish().code == kNonfinite) throw_nonfinite(c.x, c.e_old, c.n, *c.ws);
  stages.mark("finish");
  return need;
}

std::size_t encode_terngrad(const EncodeCall& c) {
  const std::size_t need = c.codec->max_bytes(c.n);
  gcomp::detail::require_capacity(need, c.cap);
  const double clip = c.codec->params().clip;
  std::byte params[4];
  gcomp::detail::store_le<float>(params, static_cast<float>(clip));
  const std::size_t code_bytes = (2 * static_cast<std::uint64_t>(c.n) + 7) / 8;
  unsigned char* data = header_for(c, params, {4, code_bytes});
  const std::size_t blocks = blocks_of(c.n);
  Carve size;
  for (int k = 0; k < 4; ++k) size.take<double>(blocks);
  size.take<std::uint32_t>(blocks);
  size.take<Ternary>(1);
  Carve carve(c.ws->reserve(size.bytes()));
  BlockOut st{carve.take<double>(blocks), carve.take<double>(blocks), nullptr};
  double* tmp1 = carve.take<double>(blocks);
  double* tmp2 = carve.take<double>(blocks);
  st.mx = carve.take<std::uint32_t>(blocks);
  Ternary* t = carve.take<Ternary>(1);
  const cudaStream_t s = c.ws->stream();
  Stages stages(s, "encode", "terngrad", c.n);
  c.ws->reset_report();
  if (c.n > 0) launch_block_stats<false>(c, blocks, nullptr, st);
  stages.mark("stats");
  tern_finish_kernel<<<1, kFinishThreads, 0, s>>>(st, tmp1, tmp2, blocks, c.n, clip, data, t,
                                            c.ws->report());
  GCOMP_LAUNCHED("terngrad scaler");
  stages.mark("scaler");
  if (c.n > 0) {
    const float* src = c.e_old ? c.e_new : c.x;
    codes_kernel<TernQ><<<grid_for(c.n, kTile), kThreads, 0, s>>>(
        TernQ{t}, 2, src, c.e_old ? c.e_new : nullptr, c.n,
        draw_key_of(c.seed, CodecKind::terngrad), data + 4, code_bytes, c.ws->report());
    GCOMP_LAUNCHED("terngrad codes");
    stages.mark("codes");
  }
  if (c.ws->finish().code == kNonfinite) throw_nonfinite(c.x, c.e_old, c.n, *c.ws);
  stages.mark("finish");
  return need;
}

std::size_t encode_qsgd(const EncodeCall& c) {
  const std::size_t need = c.codec->max_bytes(c.n);
  gcomp::detail::require_capacity(need, c.cap);
  const gcomp::detail::CodecParams qp = c.codec->params();
  const int bits = qp.bits;
  const std::size_t bucket = qp.bucket;
  const std::size_t buckets = (c.n + bucket - 1) / bucket;
  const std::size_t code_bytes = (static_cast<std::uint64_t>(c.n) * bits + 7) / 8;
  std::byte params[8] = {};
  params[0] = static_cast<std::byte>(bits);
  gcomp::detail::store_le<std::uint32_t>(params + 4, static_cast<std::uint32_t>(bucket));
  unsigned char* norms = header_for(c, params, {4 * buckets, code_bytes});
  unsigned char* codes = norms + 4 * buckets;
  Carve size;
  size.take<QsgdScale>(buckets);
  Carve carve(c.ws->reserve(size.bytes()));
  QsgdScale* bk = carve.take<QsgdScale>(buckets);
  const float levels = gcomp::detail::qsgd_levels(bits);
  const cudaStream_t s = c.ws->stream();
  Stages stages(s, "encode", "qsgd", c.n);
  c.ws->reset_report();
  if (c.n > 0 && bucket % 64 == 0 && kTile % bucket == 0) {
    const DrawKey key = draw_key_of(c.seed, CodecKind::qsgd);
    if (c.e_old) {
      qsgd_fused_kernel<true><<<grid_for(c.n, kTile), kThreads, 0, s>>>(
          c.x, c.e_old, c.e_new, c.n, bucket, buckets, levels, bits, key, norms, codes,
          code_bytes, c.ws->report());
    } else {
      qsgd_fused_kernel<false><<<grid_for(c.n, kTile), kThreads, 0, s>>>(
          c.x, nullptr, nullptr, c.n, bucket, buckets, levels, bits, key, norms, codes,
          code_bytes, c.ws->report());
    }
    GCOMP_LAUNCHED("qsgd norms and codes");
    stages.mark("norms_and_codes");
  } else if (c.n > 0) {
    const unsigned grid = grid_for(buckets * 16);
    if (c.e_old) {
      qsgd_norm_kernel<true><<<grid, kThreads, 0, s>>>(c.x, c.e_old, c.e_new, c.n, bucket,
                                                       buckets, levels, bk, norms, c.ws->report());
    } else {
      qsgd_norm_kernel<false><<<grid, kThreads, 0, s>>>(c.x, nullptr, nullptr, c.n, bucket,
                                                        buckets, levels, bk, norms, c.ws->report());
    }
    GCOMP_LAUNCHED("qsgd norms");
    stages.mark("norms");
    const float* src = c.e_old ? c.e_new : c.x;
    const QsgdQ q{bk, bucket, levels, bits, c.n < (std::size_t{1} << 32)};
    codes_kernel<QsgdQ><<<grid_for(c.n, kTile), kThreads, 0, s>>>(
        q, bits, src, c.e_old ? c.e_new : nullptr, c.n, draw_key_of(c.seed, CodecKind::qsgd), codes,
        code_bytes, c.ws->report());
    GCOMP_LAUNCHED("qsgd codes");
    stages.mark("codes");
  }
  if (c.ws->finish().code == kNonfinite) throw_nonfinite(c.x, c.e_old, c.n, *c.ws);
  stages.mark("finish");
  return need;
}

void decode_sign(const DecodeCall& d) {
  const std::size_t n = d.p.n;
  const std::size_t bytes = d.p.sections[1].size;
  const cudaStream_t s = d.ws->stream();
  d.ws->reset_report();
  sign_validate_kernel<<<1, 1, 0, s>>>(d.sections[0], d.sections[1], n, bytes, d.ws->report());
  GCOMP_LAUNCHED("sign validate");
  if (n > 0 && d.apply) {
    sign_decode_kernel<<<grid_for_rounds(n), kThreads, 0, s>>>(d.sections[0], d.sections[1], n,
                                                               d.acc, d.alpha, d.ws->report());
    GCOMP_LAUNCHED("sign decode_add");
  }
  const Report& r = d.ws->finish();
  if (r.code != kBadPayload) return check_size(d);
  if (r.what & 1u) gcomp::detail::bad_payload("sign scale is negative, NaN or Inf");
  gcomp::detail::bad_payload("sign padding bits are not zero");
}

void decode_terngrad(const DecodeCall& d) {
  const std::size_t n = d.p.n;
  const std::size_t bytes = d.p.sections[1].size;
  const cudaStream_t s = d.ws->stream();
  d.ws->reset_report();
  tern_validate_kernel<<<grid_for_rounds(bytes), kThreads, 0, s>>>(d.sections[0], d.sections[1],
                                                                   n, bytes, d.ws->report());
  GCOMP_LAUNCHED("terngrad validate");
  if (n > 0 && d.apply) {
    tern_decode_kernel<<<grid_for_rounds(n), kThreads, 0, s>>>(d.sections[0], d.sections[1], n,
                                                               d.acc, d.alpha, d.ws->report());
    GCOMP_LAUNCHED("terngrad decode_add");
  }
  const Report& r = d.ws->finish();
  if (r.code != kBadPayload) return check_size(d);
  if (r.what & 1u) gcomp::detail::bad_payload("terngrad scaler is negative, NaN or Inf");
  if (r.what & 2u) {
    gcomp::detail::bad_payload("invalid terngrad code 3 in byte " + std::to_string(r.first));
  }
  gcomp::detail::bad_payload("terngrad code padding bits are not zero");
}

void decode_qsgd(const DecodeCall& d) {
  const std::size_t n = d.p.n;
  const int bits = static_cast<int>(d.p.params[0]);
  const std::size_t bucket = gcomp::detail::load_le<std::uint32_t>(d.p.params + 4);
  const std::size_t buckets = (n + bucket - 1) / bucket;
  const std::size_t code_bytes = d.p.sections[1].size;
  const cudaStream_t s = d.ws->stream();
  Stages stages(s, "decode_add", "qsgd", n);
  Carve size;
  size.take<float>(buckets);
  Carve carve(d.ws->reserve(size.bytes()));
  float* steps = carve.take<float>(buckets);
  d.ws->reset_report();
  qsgd_validate_kernel<<<grid_for(buckets), kThreads, 0, s>>>(
      d.sections[0], buckets, d.sections[1], code_bytes, static_cast<std::uint64_t>(n) * bits,
      gcomp::detail::qsgd_levels(bits), steps, d.ws->report());
  GCOMP_LAUNCHED("qsgd validate");
  stages.mark("validate");
  if (n > 0 && d.apply) {
    // The usual widths with their byte counts fixed; the others as the payload says.
    if (bits == 4) {
      launch_qsgd_decode<4>(d, steps, n, bucket, bits, s);
    } else if (bits == 8) {
      launch_qsgd_decode<8>(d, steps, n, bucket, bits, s);
    } else if (bits == 2) {
      launch_qsgd_decode<2>(d, steps, n, bucket, bits, s);
    } else {
      launch_qsgd_decode<0>(d, steps, n, bucket, bits, s);
    }
    GCOMP_LAUNCHED("qsgd decode_add");
    stages.mark("add");
  }
  const Report& r = d.ws->finish();
  stages.mark("finish");
  if (r.code != kBadPayload) return check_size(d);
  if (r.what & 1u) {
    gcomp::detail::bad_payload("qsgd norm of bucket " + std::to_string(r.first) +
                               " is negative, NaN or Inf");
  }
  gcomp::detail::bad_payload("qsgd code padding bits are not zero");
}

}  // namespace

std::span<const DeviceCodec> quantizer_device_codecs() {
  static const DeviceCodec list[] = {{CodecKind::sign, encode_sign, decode_sign},
                                     {CodecKind::terngrad, encode_terngrad, decode_terngrad},
                                     {CodecKind::qsgd, encode_qsgd, decode_qsgd}};
  return list;
}

}  // namespace gcomp::cuda::detail
