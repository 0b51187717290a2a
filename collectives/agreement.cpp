// The agreement (agreement.hpp).
#include "agreement.hpp"

#include <limits>

namespace gcomp::detail {

namespace {
constexpr std::uint64_t k63 = (std::uint64_t{1} << 63) - 1;
}  // namespace

void Agreement::seal(std::uint64_t signature) {
  sig = signature & k63;
  not_sig = k63 & ~sig;
}

void Agreement::fail(Status status, int rank) {
  not_fail = k63 & ~((static_cast<std::uint64_t>(status) << 32) | static_cast<std::uint32_t>(rank));
}

bool Agreement::same_signature() const { return sig == (k63 & ~not_sig); }

void Agreement::seal_memory(std::uint64_t signature) {
  memory = signature & k63;
  not_memory = k63 & ~memory;
}

bool Agreement::same_memory() const { return memory == (k63 & ~not_memory); }

Status Agreement::failed_status() const { return static_cast<Status>((k63 & ~not_fail) >> 32); }

int Agreement::failed_rank() const { return static_cast<int>((k63 & ~not_fail) & 0xffffffffu); }

bool sum_cannot_overflow(int ranks, std::uint64_t magnitude) {
  if (magnitude >= kNotMeasured || ranks < 1) return false;
  const double m = bits_float(static_cast<std::uint32_t>(magnitude));
  return m * ranks <= std::numeric_limits<float>::max() / 2.0;
}

}  // namespace gcomp::detail
