// Whether the SIMD kernels may run. They produce the same bytes as the scalar reference kernels;
// tests switch SIMD off to compare the two on the same input.
#pragma once

#include <atomic>

namespace gcomp::detail {

inline std::atomic<bool>& simd_switch() noexcept {
  static std::atomic<bool> on{true};
  return on;
}
inline bool simd_enabled() noexcept { return simd_switch().load(std::memory_order_relaxed); }
inline void set_simd_enabled(bool on) noexcept { simd_switch().store(on); }

}  // namespace gcomp::detail
