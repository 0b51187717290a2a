// float -> fp16 bits by integer arithmetic, the steps of compressors/half.hpp's float_to_half, for
// fp16 values that the kernels store a byte at a time (a payload's values at any alignment).
// Where the bits came from cvt.rn.f16.f32, ptxas (CUDA 13.0, sm_90) compiled the store of their
// low byte as a conversion of the float to an 8-bit integer: on the H200 every such byte was the
// value's integer part (0 for negative values), while the high byte and the value read back were
// right. Integer arithmetic leaves it nothing to fold. tests/cuda/half_bits_test.cpp checks this
// function against float_to_half on the host.
#pragma once

#include <cstdint>
#include <cstring>

#include "host_device.hpp"

namespace gcomp::cuda::detail {

GCOMP_HOST_DEVICE inline std::uint32_t half_bits_of(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t a = x & 0x7fffffffu;
  if (a >= 0x477ff000u) return sign | 0x7bffu;  // >= 65520: saturate
  if (a < 0x38800000u) {
    // Below 2^-14: adding 0.5 puts the fp16 subnormal grid on the float's last mantissa bit, and
    // the float addition's round to nearest even does the rounding.
    float m;
    std::memcpy(&m, &a, sizeof m);
    const float r = m + 0.5f;
    std::uint32_t rb;
    std::memcpy(&rb, &r, sizeof rb);
    return sign | (rb - (126u << 23));
  }
  const std::uint32_t odd = (a >> 13) & 1u;
  a += (static_cast<std::uint32_t>(15 - 127) << 23) + 0xfffu + odd;  // rebias and round
  return sign | (a >> 13);
}

}  // namespace gcomp::cuda::detail
