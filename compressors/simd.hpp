// Which SIMD kernels run. The library is compiled for the x86-64 baseline (unless GCOMP_NATIVE),
// so that it runs on the machine it is installed on; the kernels that gain from wider vectors are
// compiled again for AVX2 and for AVX-512 (function target attributes) and chosen at run time
// from the CPU, capped by GCOMP_SIMD (baseline, avx2, avx512) and by the tests' set_simd_level().
// Every level writes the same bytes as the scalar reference: gcomp_core is compiled with
// -ffp-contract=off (no fused multiply-adds at any level), compilers do not reorder float sums
// without -ffast-math, and the sums a codec puts on the wire run in the canonical order of
// reduce.hpp. tests/codec_test.cpp compares every level the machine can run.
#pragma once

#include <string_view>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define GCOMP_X86 1
#include <immintrin.h>
// The ISA of each level (x86-64-v3 and x86-64-v4 as instruction sets, without changing the
// tuning: functions with the same arch and tune inline each other, so a kernel's helpers and the
// standard library's inline functions are compiled into it for its level).
#define GCOMP_ISA_AVX2 "avx2,avx,fma,bmi,bmi2,f16c,lzcnt,popcnt,movbe,sse4.2"
#define GCOMP_TARGET_AVX2 __attribute__((target(GCOMP_ISA_AVX2)))
#define GCOMP_TARGET_AVX512 \
  __attribute__((target(GCOMP_ISA_AVX2 ",avx512f,avx512bw,avx512cd,avx512dq,avx512vl")))
#else
#define GCOMP_X86 0
#endif
#define GCOMP_ALWAYS_INLINE inline __attribute__((always_inline))

namespace gcomp::detail {

enum class SimdLevel : int { baseline = 0, avx2 = 1, avx512 = 2 };

// What this CPU and its operating system can run.
SimdLevel cpu_simd_level() noexcept;
// The level in use: the CPU's, capped by GCOMP_SIMD and by set_simd_level().
SimdLevel simd_level() noexcept;
// Caps the level (tests compare every level); a level above the CPU's or GCOMP_SIMD's runs that.
void set_simd_level(SimdLevel cap) noexcept;
std::string_view simd_level_name(SimdLevel level) noexcept;
// GCOMP_SIMD's problem ("" when it is unset or valid), for check_environment().
const std::string& simd_environment_error();

inline bool use_avx512() noexcept { return GCOMP_X86 && simd_level() >= SimdLevel::avx512; }

}  // namespace gcomp::detail

// Defines `ret name params` (params may end in noexcept), which runs `name##_body args` (a
// GCOMP_ALWAYS_INLINE function) compiled for the level in use: the body and everything it inlines
// are vectorized by the compiler for AVX-512, AVX2 or the baseline (static functions name_avx512,
// name_avx2, name_baseline).
#if GCOMP_X86
#define GCOMP_MULTIVERSION(ret, name, params, args)                                \
  GCOMP_TARGET_AVX512 static ret name##_avx512 params { return name##_body args; } \
  GCOMP_TARGET_AVX2 static ret name##_avx2 params { return name##_body args; }     \
  static ret name##_baseline params { return name##_body args; }                   \
  ret name params {                                                                \
    switch (::gcomp::detail::simd_level()) {                                       \
      case ::gcomp::detail::SimdLevel::avx512:                                     \
        return name##_avx512 args;                                                 \
      case ::gcomp::detail::SimdLevel::avx2:                                       \
        return name##_avx2 args;                                                   \
      default:                                                                     \
        return name##_baseline args;                                               \
    }                                                                              \
  }
#else
#define GCOMP_MULTIVERSION(ret, name, params, args) \
  ret name params { return name##_body args; }
#endif
