// Non-finite input reports (see nonfinite.hpp).
#include "nonfinite.hpp"

#include <cmath>
#include <cstdio>
#include <string>

#include "bytes.hpp"
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

}  // namespace gcomp::detail
