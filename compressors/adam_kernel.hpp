// The element-wise arithmetic of Adam's functions (include/gcomp/adam.hpp), shared by the CPU
// loops of compressors/adam.cpp and the CUDA kernels of cuda/adam.cu, so that both round every
// product, quotient and square root alike: one float operation at a time, no fused multiply-add
// (-ffp-contract=off here, --fmad=false there), IEEE division and square root on both. The
// factors are worked out once per call on the host, in double, and rounded to float once.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "host_device.hpp"

namespace gcomp::detail {

enum class AdamOp : std::uint8_t {
  step,            // adam_step
  local_momentum,  // adam_local_momentum
  frozen_update,   // adam_frozen_update
  sync_momentum,   // adam_sync_momentum
  sync_update,     // adam_sync_update
};

// The float factors of one call.
struct AdamKernel {
  AdamOp op = AdamOp::step;
  float beta1 = 0, keep1 = 0;  // m = beta1 m + keep1 g
  float beta2 = 0, keep2 = 0;  // v = beta2 v + keep2 g^2
  float l2 = 0;                // Adam's L2 term, g += l2 p (0 for AdamW)
  float shrink = 1;            // AdamW's p *= shrink; the synchronizations' decay of the anchor
  float step_size = 0;         // lr / (1 - beta1^t); the synchronizations' lr_sum
  float root2 = 1;             // sqrt(1 - beta2^variance_steps)
  float eps = 0;
  float limit = 0;  // > 0: m^ / (sqrt(v^) + eps) clamped to +-limit, 0 where v is 0
  float scale = 1;  // sync_momentum: 1 / lr_sum; sync_update: 1 - beta1^t
};

// The arrays of one call, n elements each; what an op does not use is null. Each element is
// read whole before it is written, so an output may be the memory of an input the function's
// contract lets it share (out = grad, momentum = exp_avg, the param read and written in place).
struct AdamArrays {
  const float* param = nullptr;
  float* param_out = nullptr;
  const float* grad = nullptr;  // the gradient, or the momentum averaged by the collective
  const float* exp_avg = nullptr;
  float* exp_avg_out = nullptr;
  const float* exp_avg_sq = nullptr;
  float* exp_avg_sq_out = nullptr;
  const float* anchor = nullptr;
  float* anchor_out = nullptr;
  float* out = nullptr;
};

// q clamped to [-limit, limit] as std::clamp does it (a NaN stays NaN).
GCOMP_HOST_DEVICE inline float adam_clamp(float q, float limit) {
  return q < -limit ? -limit : (limit < q ? limit : q);
}

// sqrt(v) / root2 + eps: the denominator of Adam's step.
GCOMP_HOST_DEVICE inline float adam_denom(float v, const AdamKernel& k) {
  return sqrtf(v) / k.root2 + k.eps;
}

// p moved by m with the variance v: p *= shrink, p -= step_size * m / denom (clamped when
// limit > 0, and not moved where v is 0).
GCOMP_HOST_DEVICE inline float adam_moved(float p, float m, float v, const AdamKernel& k) {
  float x = p;
  if (k.shrink != 1.0f) x *= k.shrink;
  float q = m / adam_denom(v, k);
  if (k.limit > 0.0f) q = v == 0.0f ? 0.0f : adam_clamp(q, k.limit);
  return x + -k.step_size * q;
}

template <AdamOp Op>
GCOMP_HOST_DEVICE inline void adam_element(const AdamKernel& k, const AdamArrays& a,
                                           std::size_t i) {
  if constexpr (Op == AdamOp::step) {
    const float p = a.param[i];
    float g = a.grad[i];
    if (k.l2 != 0.0f) g = g + k.l2 * p;
    const float m = a.exp_avg[i] * k.beta1 + k.keep1 * g;
    const float v = a.exp_avg_sq[i] * k.beta2 + k.keep2 * (g * g);
    a.exp_avg_out[i] = m;
    a.exp_avg_sq_out[i] = v;
    a.param_out[i] = adam_moved(p, m, v, k);
  } else if constexpr (Op == AdamOp::local_momentum) {
    float g = a.grad[i];
    if (k.l2 != 0.0f) g = g + k.l2 * a.param[i];
    a.out[i] = a.exp_avg[i] * k.beta1 + k.keep1 * g;
  } else if constexpr (Op == AdamOp::frozen_update) {
    const float u = a.grad[i];
    const float p = a.param[i];
    const float v = a.exp_avg_sq[i];
    a.exp_avg_out[i] = u;
    a.param_out[i] = adam_moved(p, u, v, k);
  } else if constexpr (Op == AdamOp::sync_momentum) {
    a.out[i] = (k.shrink * a.anchor[i] - a.param[i]) * adam_denom(a.exp_avg_sq[i], k) * k.scale;
  } else {
    static_assert(Op == AdamOp::sync_update);
    const float u = a.grad[i];
    const float v = a.exp_avg_sq[i];
    const float q = v == 0.0f ? 0.0f : adam_clamp(u / adam_denom(v, k), k.limit);
    const float x = k.shrink * a.anchor[i] + -k.step_size * q;
    a.exp_avg_out[i] = u * k.scale;
    a.param_out[i] = x;
    a.anchor_out[i] = x;
  }
}

// The loop of one call over host memory.
template <AdamOp Op>
void adam_host_loop(const AdamKernel& k, const AdamArrays& a, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) adam_element<Op>(k, a, i);
}

inline void adam_host(const AdamKernel& k, const AdamArrays& a, std::size_t n) {
  switch (k.op) {
    case AdamOp::step:
      return adam_host_loop<AdamOp::step>(k, a, n);
    case AdamOp::local_momentum:
      return adam_host_loop<AdamOp::local_momentum>(k, a, n);
    case AdamOp::frozen_update:
      return adam_host_loop<AdamOp::frozen_update>(k, a, n);
    case AdamOp::sync_momentum:
      return adam_host_loop<AdamOp::sync_momentum>(k, a, n);
    case AdamOp::sync_update:
      return adam_host_loop<AdamOp::sync_update>(k, a, n);
  }
}

}  // namespace gcomp::detail
