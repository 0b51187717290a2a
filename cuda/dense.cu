// none, fp16 and bf16 on the device (compressors/dense.cpp): one pass per encode, error feedback
// fused (v = x + e; h = round(v); e = v - h), saturating round-to-nearest-even as the CPU.
#include <string>

#include "codecs.cuh"

namespace gcomp::cuda::detail {

namespace {

// float -> bf16 bits as compressors/dense.cpp's to_bf16: saturate, else round to nearest even.
__device__ __forceinline__ std::uint32_t to_bf16(float v) {
  const std::uint32_t u = __float_as_uint(v);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f7f8000u) return ((u >> 16) & 0x8000u) | 0x7f7fu;
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
__device__ __forceinline__ float from_bf16(std::uint32_t h) { return __uint_as_float(h << 16); }

template <CodecKind K, bool EF>
__global__ void encode_kernel(const float* __restrict__ x, const float* __restrict__ e_old,
                              float* __restrict__ e_new, std::size_t n,
                              unsigned char* __restrict__ data, Report* r) {
  bool bad = false;
  GCOMP_GRID_LOOP(i, n) {
    float v = x[i];
    if (EF) v = v + e_old[i];
    bad |= nonfinite(v);
    if constexpr (K == CodecKind::none) {
      store_u32(data + 4 * i, __float_as_uint(v));
      if (EF) e_new[i] = 0.0f;
    } else if constexpr (K == CodecKind::fp16) {
      const std::uint32_t h = to_half(v);
      store_u16(data + 2 * i, h);
      if (EF) e_new[i] = v - from_half(h);
    } else {
      const std::uint32_t h = to_bf16(v);
      store_u16(data + 2 * i, h);
      if (EF) e_new[i] = v - from_bf16(h);
    }
  }
  if (bad) report_nonfinite(r);
}

// The value checks of validate_dense: the first non-finite element.
template <CodecKind K>
__global__ void validate_kernel(const unsigned char* __restrict__ data, std::size_t n, Report* r) {
  GCOMP_GRID_LOOP(i, n) {
    bool bad;
    if constexpr (K == CodecKind::none) {
      bad = (load_u32(data + 4 * i) & kInfBits) == kInfBits;
    } else if constexpr (K == CodecKind::fp16) {
      bad = (load_u16(data + 2 * i) & 0x7c00u) == 0x7c00u;
    } else {
      bad = (load_u16(data + 2 * i) & 0x7f80u) == 0x7f80u;
    }
    if (bad) report_bad(r, 0, i);
  }
}

template <CodecKind K>
__global__ void decode_kernel(const unsigned char* __restrict__ data, std::size_t n,
                              float* __restrict__ acc, float alpha, const Report* r) {
  if (r->code != 0) return;
  GCOMP_GRID_LOOP(i, n) {
    float v;
    if constexpr (K == CodecKind::none) {
      v = __uint_as_float(load_u32(data + 4 * i));
    } else if constexpr (K == CodecKind::fp16) {
      v = from_half(load_u16(data + 2 * i));
    } else {
      v = from_bf16(load_u16(data + 2 * i));
    }
    acc[i] += alpha * v;
  }
}

template <CodecKind K>
void launch_encode(const EncodeCall& c, unsigned char* data) {
  const cudaStream_t s = c.ws->stream();
  if (c.e_old) {
    encode_kernel<K, true>
        <<<grid_for(c.n), kThreads, 0, s>>>(c.x, c.e_old, c.e_new, c.n, data, c.ws->report());
  } else {
    encode_kernel<K, false>
        <<<grid_for(c.n), kThreads, 0, s>>>(c.x, nullptr, nullptr, c.n, data, c.ws->report());
  }
  GCOMP_LAUNCHED("dense encode");
}

template <CodecKind K>
void launch_decode(const DecodeCall& d) {
  const cudaStream_t s = d.ws->stream();
  const std::size_t n = d.p.n;
  validate_kernel<K><<<grid_for(n), kThreads, 0, s>>>(d.sections[0], n, d.ws->report());
  GCOMP_LAUNCHED("dense validate");
  decode_kernel<K><<<grid_for(n), kThreads, 0, s>>>(d.sections[0], n, d.acc, d.alpha,
                                                     d.ws->report());
  GCOMP_LAUNCHED("dense decode_add");
}

}  // namespace

std::size_t encode_dense(const EncodeCall& c) {
  const CodecKind kind = c.codec->kind();
  const std::size_t need = c.codec->max_bytes(c.n);
  gcomp::detail::require_capacity(need, c.cap);
  const std::size_t width = kind == CodecKind::none ? 4 : 2;
  std::byte head[gcomp::detail::kMaxHeaderBytes];
  const std::byte* end = gcomp::detail::write_header(head, kind, c.n, nullptr, {c.n * width});
  unsigned char* data =
      put_header(c, reinterpret_cast<const unsigned char*>(head), static_cast<std::size_t>(end - head));
  c.ws->reset_report();
  if (c.n > 0) {
    if (kind == CodecKind::none) launch_encode<CodecKind::none>(c, data);
    if (kind == CodecKind::fp16) launch_encode<CodecKind::fp16>(c, data);
    if (kind == CodecKind::bf16) launch_encode<CodecKind::bf16>(c, data);
  }
  if (c.ws->finish().code == kNonfinite) throw_nonfinite(c.x, c.e_old, c.n, *c.ws);
  return need;
}

void decode_dense(const DecodeCall& d) {
  d.ws->reset_report();
  if (d.p.n > 0) {
    if (d.p.kind == CodecKind::none) launch_decode<CodecKind::none>(d);
    if (d.p.kind == CodecKind::fp16) launch_decode<CodecKind::fp16>(d);
    if (d.p.kind == CodecKind::bf16) launch_decode<CodecKind::bf16>(d);
  }
  const Report& r = d.ws->finish();
  if (r.code == kBadPayload) {
    gcomp::detail::bad_payload(std::string(codec_name(d.p.kind)) +
                               " payload holds a NaN or Inf value (at or after element " +
                               std::to_string(r.first) + ")");
  }
}

}  // namespace gcomp::cuda::detail
