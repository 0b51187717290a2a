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
//
// This file: sign and TernGrad, and the quantizers' list; QSGD is qsgd.cu; what they share,
// quantize.cuh.
#include "quantize.cuh"

namespace gcomp::cuda::detail {

namespace {

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
  finish_encode(c);
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
  if (c.n > 0) launch_codes(c, TernQ{t}, 2, data + 4, code_bytes, "terngrad codes", stages);
  finish_encode(c);
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
  const Report* r = decode_failure(d);
  if (!r) return;
  if (r->what & 1u) gcomp::detail::bad_payload("sign scale is negative, NaN or Inf");
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
  const Report* r = decode_failure(d);
  if (!r) return;
  if (r->what & 1u) gcomp::detail::bad_payload("terngrad scaler is negative, NaN or Inf");
  if (r->what & 2u) {
    gcomp::detail::bad_payload("invalid terngrad code 3 in byte " + std::to_string(r->first));
  }
  gcomp::detail::bad_payload("terngrad code padding bits are not zero");
}

}  // namespace

std::span<const DeviceCodec> quantizer_device_codecs() {
  static const DeviceCodec list[] = {{CodecKind::sign, encode_sign, decode_sign},
                                     {CodecKind::terngrad, encode_terngrad, decode_terngrad},
                                     {CodecKind::qsgd, encode_qsgd, decode_qsgd}};
  return list;
}

}  // namespace gcomp::cuda::detail
