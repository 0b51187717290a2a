// QSGD on the device (compressors/qsgd.cpp), byte for byte as the CPU: each bucket's norm in the
// canonical order (a half-warp per bucket), the codes with Philox draws in the layout of
// compressors/philox.hpp, and the decode_add with its validation (quantizers.cu explains the
// shared scheme; quantize.cuh holds it). With buckets that tile the code tile (the default 512)
// the norms and codes come from one pass (qsgd_fused_kernel), e_new getting v - decode at once.
#include "quantize.cuh"

namespace gcomp::cuda::detail {

namespace {

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

}  // namespace

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
    const QsgdQ q{bk, bucket, levels, bits, c.n < (std::size_t{1} << 32)};
    launch_codes(c, q, bits, codes, code_bytes, "qsgd codes", stages);
  }
  finish_encode(c);
  stages.mark("finish");
  return need;
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
  const Report* r = decode_failure(d, &stages);
  if (!r) return;
  if (r->what & 1u) {
    gcomp::detail::bad_payload("qsgd norm of bucket " + std::to_string(r->first) +
                               " is negative, NaN or Inf");
  }
  gcomp::detail::bad_payload("qsgd code padding bits are not zero");
}

}  // namespace gcomp::cuda::detail
