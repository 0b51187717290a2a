// none, fp16 and bf16 on the device (compressors/cast.cpp): one pass per encode, error feedback
// fused (v = x + e; h = round(v); e = v - h), saturating round-to-nearest-even as the CPU.
#include <string>

#include "codecs.cuh"
#include "half_bits.hpp"

namespace gcomp::cuda::detail {

namespace {

// float -> bf16 bits as compressors/cast.cpp's to_bf16: saturate, else round to nearest even.
__device__ __forceinline__ std::uint32_t to_bf16(float v) {
  const std::uint32_t u = __float_as_uint(v);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f7f8000u) return ((u >> 16) & 0x8000u) | 0x7f7fu;
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
__device__ __forceinline__ float from_bf16(std::uint32_t h) { return __uint_as_float(h << 16); }

// Element i of the values section: typed accesses when the section is aligned to its width
// (the usual case: the header is 28 bytes), byte accesses otherwise.
template <CodecKind K, bool A>
__device__ __forceinline__ void put(unsigned char* d, std::size_t i, std::uint32_t v) {
  if constexpr (K == CodecKind::none) {
    if constexpr (A) {
      reinterpret_cast<std::uint32_t*>(d)[i] = v;
    } else {
      store_u32(d + 4 * i, v);
    }
  } else if constexpr (A) {
    reinterpret_cast<std::uint16_t*>(d)[i] = static_cast<std::uint16_t>(v);
  } else {
    store_u16(d + 2 * i, v);
  }
}
template <CodecKind K, bool A>
__device__ __forceinline__ std::uint32_t get(const unsigned char* d, std::size_t i) {
  if constexpr (K == CodecKind::none) {
    if constexpr (A) return reinterpret_cast<const std::uint32_t*>(d)[i];
    return load_u32(d + 4 * i);
  } else {
    if constexpr (A) return reinterpret_cast<const std::uint16_t*>(d)[i];
    return load_u16(d + 2 * i);
  }
}

// The bits stored for v. fp16 stored a byte at a time (A false) converts by integer arithmetic
// (half_bits.hpp says why); two-byte stores take the hardware's conversion.
template <CodecKind K, bool A>
__device__ __forceinline__ std::uint32_t bits_of(float v) {
  if constexpr (K == CodecKind::none) {
    return __float_as_uint(v);
  } else if constexpr (K == CodecKind::fp16) {
    return A ? to_half(v) : half_bits_of(v);
  } else {
    return to_bf16(v);
  }
}
template <CodecKind K>
__device__ __forceinline__ float value_of(std::uint32_t u) {
  if constexpr (K == CodecKind::none) {
    return __uint_as_float(u);
  } else if constexpr (K == CodecKind::fp16) {
    return from_half(u);
  } else {
    return from_bf16(u);
  }
}

template <CodecKind K, bool EF, bool A>
__global__ void encode_kernel(const float* __restrict__ x, const float* __restrict__ e_old,
                              float* __restrict__ e_new, std::size_t n,
                              unsigned char* __restrict__ data, Report* r) {
  bool bad = false;
  GCOMP_GRID_ROUNDS(i0, stride, n) {
    float v[kUnroll];
    float e[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const std::size_t i = i0 + k * stride;
      if (i < n) {
        v[k] = x[i];
        if (EF) e[k] = e_old[i];
      }
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const std::size_t i = i0 + k * stride;
      if (i >= n) continue;
      float w = v[k];
      if (EF) w = w + e[k];
      bad |= nonfinite(w);
      const std::uint32_t h = bits_of<K, A>(w);
      put<K, A>(data, i, h);
      if (EF) e_new[i] = K == CodecKind::none ? 0.0f : w - value_of<K>(h);
    }
  }
  if (bad) report_nonfinite(r);
}

// The value checks of validate_dense: the first non-finite element.
template <CodecKind K, bool A>
__global__ void validate_kernel(const unsigned char* __restrict__ data, std::size_t n, Report* r) {
  GCOMP_GRID_ROUNDS(i0, stride, n) {
    std::uint32_t u[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const std::size_t i = i0 + k * stride;
      if (i < n) u[k] = get<K, A>(data, i);
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const std::size_t i = i0 + k * stride;
      if (i >= n) continue;
      bool bad;
      if constexpr (K == CodecKind::none) {
        bad = (u[k] & kInfBits) == kInfBits;
      } else if constexpr (K == CodecKind::fp16) {
        bad = (u[k] & 0x7c00u) == 0x7c00u;
      } else {
        bad = (u[k] & 0x7f80u) == 0x7f80u;
      }
      if (bad) report_bad(r, 0, i);
    }
  }
}

template <CodecKind K, bool A>
__global__ void decode_kernel(const unsigned char* __restrict__ data, std::size_t n,
                              float* __restrict__ acc, float alpha, const Report* r) {
  if (r->code != 0) return;
  GCOMP_GRID_ROUNDS(i0, stride, n) {
    std::uint32_t u[kUnroll];
    float a[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const std::size_t i = i0 + k * stride;
      if (i < n) {
        u[k] = get<K, A>(data, i);
        a[k] = acc[i];
      }
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const std::size_t i = i0 + k * stride;
      if (i < n) acc[i] = a[k] + alpha * value_of<K>(u[k]);
    }
  }
}

constexpr std::uintptr_t width_of(CodecKind k) { return k == CodecKind::none ? 4 : 2; }

template <CodecKind K, bool A>
void launch_encode_as(const EncodeCall& c, unsigned char* data) {
  const cudaStream_t s = c.ws->stream();
  if (c.e_old) {
    encode_kernel<K, true, A>
        <<<grid_for_rounds(c.n), kThreads, 0, s>>>(c.x, c.e_old, c.e_new, c.n, data,
                                                   c.ws->report());
  } else {
    encode_kernel<K, false, A>
        <<<grid_for_rounds(c.n), kThreads, 0, s>>>(c.x, nullptr, nullptr, c.n, data,
                                                   c.ws->report());
  }
  GCOMP_LAUNCHED("dense encode");
}

template <CodecKind K>
void launch_encode(const EncodeCall& c, unsigned char* data) {
  if (reinterpret_cast<std::uintptr_t>(data) % width_of(K) == 0) {
    launch_encode_as<K, true>(c, data);
  } else {
    launch_encode_as<K, false>(c, data);
  }
}

template <CodecKind K, bool A>
void launch_decode_as(const DecodeCall& d) {
  const cudaStream_t s = d.ws->stream();
  const std::size_t n = d.p.n;
  validate_kernel<K, A><<<grid_for_rounds(n), kThreads, 0, s>>>(d.sections[0], n,
                                                                 d.ws->report());
  GCOMP_LAUNCHED("dense validate");
  if (!d.apply) return;
  decode_kernel<K, A><<<grid_for_rounds(n), kThreads, 0, s>>>(d.sections[0], n, d.acc, d.alpha,
                                                               d.ws->report());
  GCOMP_LAUNCHED("dense decode_add");
}

template <CodecKind K>
void launch_decode(const DecodeCall& d) {
  if (reinterpret_cast<std::uintptr_t>(d.sections[0]) % width_of(K) == 0) {
    launch_decode_as<K, true>(d);
  } else {
    launch_decode_as<K, false>(d);
  }
}

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
  finish_encode(c);
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
    // The CPU names the start of the first 65536-element chunk holding a bad value.
    constexpr unsigned long long kCpuChunk = 1ull << 16;
    gcomp::detail::bad_payload(std::string(codec_name(d.p.kind)) +
                               " payload holds a NaN or Inf value (at or after element " +
                               std::to_string(r.first / kCpuChunk * kCpuChunk) + ")");
  }
  check_size(d);
}

}  // namespace

std::span<const DeviceCodec> cast_device_codecs() {
  static const DeviceCodec list[] = {{CodecKind::none, encode_dense, decode_dense},
                                     {CodecKind::fp16, encode_dense, decode_dense},
                                     {CodecKind::bf16, encode_dense, decode_dense}};
  return list;
}

}  // namespace gcomp::cuda::detail
