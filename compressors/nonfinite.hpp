// Reporting non-finite input: the codecs detect NaN/Inf inside their main pass (cheaply, as a
// flag or a non-finite sum) and then call these to find and name the first bad element.
#pragma once

#include <cstddef>
#include <span>

namespace gcomp::detail {

// Index of the first NaN/Inf in x[0..n), or n when there is none.
std::size_t first_nonfinite(const float* x, std::size_t n) noexcept;

// Throws Error(nonfinite) naming the first NaN/Inf of x; `base` is added to the index shown.
[[noreturn]] void throw_nonfinite(const float* x, std::size_t n, std::size_t base = 0);

// The messages themselves, for a first bad element found elsewhere (the CUDA backend): x[i] is
// NaN/Inf, or x[i] and e[i] are finite and their sum is not.
[[noreturn]] void throw_nonfinite_at(std::size_t i, float xi);
[[noreturn]] void throw_nonfinite_sum_at(std::size_t i, float xi, float ei);

// For error feedback: x and e are finite but x + e is not (or x is not); names the element.
[[noreturn]] void throw_nonfinite_sum(const float* x, const float* e, std::size_t n);

// gcomp::check_finite and gcomp::copy_checked (the same errors) that also return the largest
// |x + e| (|x| when e is empty): what a rank sends when the call is not compressed, from which
// the agreement bounds the sum (communicator.cpp). copy_checked_magnitude needs a residual.
float checked_magnitude(std::span<const float> x, std::span<const float> residual);
float copy_checked_magnitude(std::span<const float> x, std::span<const float> residual,
                             std::span<float> out);

}  // namespace gcomp::detail
