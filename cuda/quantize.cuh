// What the quantizers' kernel files share (quantizers.cu: sign and TernGrad; qsgd.cu): the code
// tile, the block statistics in the canonical order, the codes with random draws, and the
// payload's header. Included by those two files only (its kernels live in each one's anonymous
// namespace).
#pragma once

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

std::size_t blocks_of(std::size_t n) { return (n + kReduceBlock - 1) / kReduceBlock; }

unsigned char* header_for(const EncodeCall& c, const std::byte* params,
                          std::initializer_list<std::uint64_t> sections) {
  std::byte head[gcomp::detail::kMaxHeaderBytes];
  const std::byte* end = gcomp::detail::write_header(head, c.codec->kind(), c.n, params, sections);
  return put_header(c, reinterpret_cast<const unsigned char*>(head),
                    static_cast<std::size_t>(end - head));
}


// The codes pass of c: v (x, or x + e in e_new) coded by q in `bits` bits into `codes`
// (code_bytes), with error feedback e_new = v - decode; `what` names the launch.
template <class Q>
void launch_codes(const EncodeCall& c, const Q& q, int bits, unsigned char* codes,
                  std::size_t code_bytes, const char* what, Stages& stages) {
  const float* src = c.e_old ? c.e_new : c.x;
  codes_kernel<Q><<<grid_for(c.n, kTile), kThreads, 0, c.ws->stream()>>>(
      q, bits, src, c.e_old ? c.e_new : nullptr, c.n, draw_key_of(c.seed, c.codec->kind()), codes,
      code_bytes, c.ws->report());
  GCOMP_LAUNCHED(what);
  stages.mark("codes");
}
}  // namespace
}  // namespace gcomp::cuda::detail
