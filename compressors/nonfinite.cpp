// Non-finite input: the reports (see nonfinite.hpp), and the public check_finite and
// copy_checked.
#include "nonfinite.hpp"

#include <atomic>
#include <cmath>
#include <cstdio>
#include <string>

#include "bytes.hpp"
#include "chunks.hpp"
#include "gcomp/codec.hpp"
#include "kernels.hpp"
#include "parallel.hpp"
#include "gcomp/error.hpp"

namespace gcomp::detail {

std::size_t first_nonfinite(const float* x, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    if ((float_bits(x[i]) & kInfBits) == kInfBits) return i;
  }
  return n;
}

namespace {
std::string show(float v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(v));
  return buf;
}
}  // namespace

void throw_nonfinite_at(std::size_t i, float xi) {
  throw Error(Status::nonfinite,
              "non-finite input: element " + std::to_string(i) + " is " + show(xi));
}

void throw_nonfinite_sum_at(std::size_t i, float xi, float ei) {
  throw Error(Status::nonfinite, "non-finite input: element " + std::to_string(i) +
                                     " plus its error-feedback residual overflows (" + show(xi) +
                                     " + " + show(ei) + ")");
}

void throw_nonfinite(const float* x, std::size_t n, std::size_t base) {
  const std::size_t i = first_nonfinite(x, n);
  if (i == n) throw Error(Status::internal, "non-finite value reported but none found");
  throw_nonfinite_at(base + i, x[i]);
}

void throw_nonfinite_sum(const float* x, const float* e, std::size_t n) {
  if (first_nonfinite(x, n) != n) throw_nonfinite(x, n);
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i] + e[i])) throw_nonfinite_sum_at(i, x[i], e[i]);
  }
  throw Error(Status::internal, "non-finite sum reported but none found");
}

namespace {

void check_sizes(std::span<const float> x, std::span<const float> residual) {
  if (!residual.empty() && residual.size() != x.size()) {
    throw Error(Status::invalid_argument, "residual of " + std::to_string(residual.size()) +
                                              " elements for an input of " +
                                              std::to_string(x.size()));
  }
}

// The largest of pass(b, e) over the chunks of [0, n), the chunks spread over the threads.
template <class Pass>
std::uint32_t max_over_chunks(std::size_t n, Pass pass) {
  std::atomic<std::uint32_t> all{0};
  for_chunks(n, std::size_t{1} << 16, [&](std::size_t b, std::size_t e) {
    const std::uint32_t m = pass(b, e);
    std::uint32_t seen = all.load(std::memory_order_relaxed);
    while (m > seen && !all.compare_exchange_weak(seen, m, std::memory_order_relaxed)) {
    }
  });
  return all.load();
}

// The magnitude's bits become the float; at or above kInfBits the first bad element is named.
float finite_or_throw(std::uint32_t bits, std::span<const float> x,
                      std::span<const float> residual) {
  if (bits < kInfBits) return bits_float(bits);
  if (residual.empty()) throw_nonfinite(x.data(), x.size());
  throw_nonfinite_sum(x.data(), residual.data(), x.size());
}

}  // namespace

float checked_magnitude(std::span<const float> x, std::span<const float> residual) {
  check_sizes(x, residual);
  const std::uint32_t bits = max_over_chunks(x.size(), [&](std::size_t b, std::size_t e) {
    return residual.empty() ? max_abs_bits(x.data() + b, e - b)
                            : max_abs_bits_sum(x.data() + b, residual.data() + b, e - b);
  });
  return finite_or_throw(bits, x, residual);
}

float copy_checked_magnitude(std::span<const float> x, std::span<const float> residual,
                             std::span<float> out) {
  if (residual.size() != x.size() || out.size() != x.size()) {
    throw Error(Status::invalid_argument, "copy_checked: sizes differ");
  }
  const std::uint32_t bits = max_over_chunks(x.size(), [&](std::size_t b, std::size_t e) {
    return add_max_abs_bits(x.data() + b, residual.data() + b, e - b, out.data() + b);
  });
  return finite_or_throw(bits, x, residual);
}

}  // namespace gcomp::detail

namespace gcomp {

// The public checks (gcomp/codec.hpp): chunked over the threads, the first bad element named.
void check_finite(std::span<const float> x, std::span<const float> residual) {
  detail::checked_magnitude(x, residual);
}

void copy_checked(std::span<const float> x, std::span<const float> residual, std::span<float> out) {
  if (!residual.empty()) {
    detail::copy_checked_magnitude(x, residual, out);
    return;
  }
  if (out.size() != x.size()) throw Error(Status::invalid_argument, "copy_checked: sizes differ");
  const std::uint32_t bits = detail::max_over_chunks(x.size(), [&](std::size_t b, std::size_t e) {
    return detail::encode_f32(x.data() + b, nullptr, e - b,
                              reinterpret_cast<std::byte*>(out.data() + b), nullptr)
               ? detail::kInfBits
               : 0u;
  });
  detail::finite_or_throw(bits, x, residual);
}

}  // namespace gcomp
