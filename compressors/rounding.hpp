// The per-element arithmetic the CPU codecs and the CUDA kernels share, written once so that
// "the same bytes on the CPU and the GPU" rests on one definition: QSGD's bucket scale and its
// stochastic rounding, TernGrad's scaler, clip bound and ternary, the norm cap and the draw's
// uniform. Plain inline C++ for the host compiler, __host__ __device__ under nvcc. The CPU
// codecs' SIMD kernels compute the same operations lane by lane (the codec tests hold every
// SIMD level to the scalar bytes, and the CUDA tests the device to the CPU's).
//
// Only operations that round the same everywhere appear here (IEEE float and double add,
// multiply, divide, sqrt, floor, fabs, compares), each rounded on its own: gcomp_core builds with
// -ffp-contract=off and the CUDA library with --fmad=false, so no product and sum fuse.
#pragma once

#include <math.h>

#include <cstdint>

#include "host_device.hpp"

namespace gcomp::detail {

// QSGD's bucket norms saturate here, the largest power of two below FLT_MAX, so that a bucket of
// huge finite values still has a finite norm.
inline constexpr float kNormCap = 0x1p127f;

// A 16-bit Philox draw as a uniform in [0, 1): u = draw / 2^16.
GCOMP_HOST_DEVICE inline float uniform_of_draw(std::uint32_t draw16) {
  return static_cast<float>(draw16) * 0x1p-16f;
}

// ---- QSGD ----

// s = 2^(bits - 1) - 1, the largest level.
GCOMP_HOST_DEVICE inline float qsgd_levels(int bits) {
  return static_cast<float>((1 << (bits - 1)) - 1);
}

// A bucket's norm from its (finite) sum of squares, saturated at kNormCap.
GCOMP_HOST_DEVICE inline float qsgd_norm(double sum_squares) {
  const double r = ::sqrt(sum_squares);
  return r >= static_cast<double>(kNormCap) ? kNormCap : static_cast<float>(r);
}

// A bucket's scale: r = |v| * inv where s / norm is finite, else (|v| / norm) * s.
struct QsgdScale {
  float norm = 0;
  float inv = 0;   // s / norm, where finite
  float step = 0;  // norm / s: a level's value
  bool use_inv = false;
};

GCOMP_HOST_DEVICE inline QsgdScale qsgd_scale(float levels, float norm) {
  QsgdScale q;
  q.norm = norm;
  q.inv = norm > 0 ? levels / norm : 0.0f;
  q.use_inv = isfinite(q.inv);
  q.step = norm / levels;
  return q;
}

// One element: level = floor(r) + [u < r - floor(r)] with r = min(|v| scaled, s); the code is
// the level with the sign bit (bit bits - 1) set for v < 0, and *decoded = +-step * level.
GCOMP_HOST_DEVICE inline std::uint32_t qsgd_code(const QsgdScale& q, float levels, int bits,
                                                 float v, std::uint32_t draw16, float* decoded) {
  const float a = ::fabsf(v);
  std::uint32_t level = 0;
  if (q.norm > 0) {
    float r = q.use_inv ? a * q.inv : (a / q.norm) * levels;
    r = levels < r ? levels : r;  // min(r, s)
    const float l = ::floorf(r);
    level = static_cast<std::uint32_t>(l) + (uniform_of_draw(draw16) < r - l ? 1u : 0u);
  }
  const bool neg = v < 0;
  const float d = q.step * static_cast<float>(level);
  *decoded = neg ? -d : d;
  return level | (neg ? 1u << (bits - 1) : 0u);
}

// ---- TernGrad ----

struct Ternary {
  float s = 0;        // the scaler
  float c = 0;        // the clip bound
  bool clip = false;  // clipping is active (clip > 0 and c > 0)
};

// The scaler and clip bound of a tensor of n elements from its sum, sum of squares and max |v|:
// c = float(clip * sigma), s = max |v|, or min(max |v|, c) when clipping.
GCOMP_HOST_DEVICE inline Ternary terngrad_scale(double total, double total_sq, std::uint64_t n,
                                                double clip, float max_abs) {
  Ternary t;
  t.s = max_abs;
  if (clip > 0 && n > 0) {
    const double mean = total / static_cast<double>(n);
    const double d = total_sq / static_cast<double>(n) - mean * mean;
    const double var = 0.0 < d ? d : 0.0;  // max(0, d)
    t.c = static_cast<float>(clip * ::sqrt(var));
    t.clip = t.c > 0;
    if (t.clip) t.s = t.c < max_abs ? t.c : max_abs;  // min(max |v|, c)
  }
  return t;
}

// One element: g = clamp(v, -c, c) when clipping; b = [u * s < |g|]; the code is 0 (zero), 1
// (+s) or 2 (-s), and *decoded the value it stands for.
GCOMP_HOST_DEVICE inline std::uint32_t ternary_code(const Ternary& t, float v,
                                                    std::uint32_t draw16, float* decoded) {
  float g = v;
  if (t.clip) {
    g = v < -t.c ? -t.c : v;  // max(v, -c)
    g = t.c < g ? t.c : g;    // min(., c)
  }
  const bool b = uniform_of_draw(draw16) * t.s < ::fabsf(g);
  const bool neg = v < 0;
  *decoded = b ? (neg ? -t.s : t.s) : 0.0f;
  return b ? (neg ? 2u : 1u) : 0u;
}

}  // namespace gcomp::detail
