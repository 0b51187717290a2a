// The SIMD level in use (see simd.hpp).
#include "simd.hpp"

#include <atomic>
#include <cstdlib>
#include <string>

#if GCOMP_X86
#include <cpuid.h>
#endif

namespace gcomp::detail {

namespace {

// F16C (the half conversions of the AVX2 level): CPUID leaf 1, ECX bit 29. Every CPU with AVX2
// has it, but clang's __builtin_cpu_supports does not know its name.
bool has_f16c() noexcept {
#if GCOMP_X86
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
#else
  return false;
#endif
}

SimdLevel detect() noexcept {
#if GCOMP_X86
  __builtin_cpu_init();
  // __builtin_cpu_supports also checks that the OS saves the wider registers (XGETBV).
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2") &&
                    __builtin_cpu_supports("fma") && __builtin_cpu_supports("popcnt") && has_f16c();
  if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl")) {
    return SimdLevel::avx512;
  }
  if (avx2) return SimdLevel::avx2;
#endif
  return SimdLevel::baseline;
}

struct EnvCap {
  SimdLevel cap = SimdLevel::avx512;
  std::string error;
};

// GCOMP_SIMD: unset or empty means no cap; baseline, avx2 or avx512 caps the level; anything else
// is an error that check_environment() reports (and the level is then the CPU's).
const EnvCap& env_cap() {
  static const EnvCap e = [] {
    EnvCap r;
    const char* v = std::getenv("GCOMP_SIMD");
    if (!v || !*v) return r;
    for (SimdLevel l : {SimdLevel::baseline, SimdLevel::avx2, SimdLevel::avx512}) {
      if (simd_level_name(l) == v) {
        r.cap = l;
        return r;
      }
    }
    r.error = std::string("GCOMP_SIMD='") + v + "' is not one of baseline, avx2, avx512";
    return r;
  }();
  return e;
}

SimdLevel min_level(SimdLevel a, SimdLevel b) {
  return static_cast<int>(a) < static_cast<int>(b) ? a : b;
}

std::atomic<int>& level_in_use() {
  static std::atomic<int> l{static_cast<int>(min_level(cpu_simd_level(), env_cap().cap))};
  return l;
}

}  // namespace

SimdLevel cpu_simd_level() noexcept {
  static const SimdLevel l = detect();
  return l;
}

SimdLevel simd_level() noexcept {
  return static_cast<SimdLevel>(level_in_use().load(std::memory_order_relaxed));
}

void set_simd_level(SimdLevel cap) noexcept {
  level_in_use().store(
      static_cast<int>(min_level(min_level(cpu_simd_level(), env_cap().cap), cap)));
}

std::string_view simd_level_name(SimdLevel level) noexcept {
  switch (level) {
    case SimdLevel::avx512:
      return "avx512";
    case SimdLevel::avx2:
      return "avx2";
    default:
      return "baseline";
  }
}

const std::string& simd_environment_error() { return env_cap().error; }

}  // namespace gcomp::detail

namespace gcomp {
std::string_view simd_level() noexcept { return detail::simd_level_name(detail::simd_level()); }
}  // namespace gcomp
