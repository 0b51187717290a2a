// The agreement (agreement.hpp).
#include "agreement.hpp"

#include <cmath>
#include <limits>
#include <string>

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

void Agreement::seal_state(std::uint64_t signature) {
  state = signature & k63;
  not_state = k63 & ~state;
}

bool Agreement::same_state() const { return state == (k63 & ~not_state); }

Status Agreement::failed_status() const { return static_cast<Status>((k63 & ~not_fail) >> 32); }

int Agreement::failed_rank() const { return static_cast<int>((k63 & ~not_fail) & 0xffffffffu); }

namespace {
[[noreturn]] void bad(const std::string& why) {
  throw Error(Status::bad_payload, "the agreement the ranks combined is malformed: " + why);
}
}  // namespace

void check_failure(const Agreement& all, int ranks) {
  if (all.any_failed()) {
    const auto status = static_cast<std::uint64_t>(all.failed_status());
    if (status == 0 || status > static_cast<std::uint64_t>(Status::transport)) {
      bad("a failure of unknown status " + std::to_string(status));
    }
    if (all.failed_rank() < 0 || all.failed_rank() >= ranks) {
      bad("a failure of rank " + std::to_string(all.failed_rank()) + " among " +
          std::to_string(ranks));
    }
  }
}

void check_agreed(const Agreement& all, int ranks, std::uint64_t n, std::uint64_t max_bytes) {
  check_failure(all, ranks);
  const auto speed = [&](std::uint64_t bits, const char* what) {
    const double v = bitsd(bits);
    if (std::isnan(v) || v < 0) bad(std::string(what) + " is not a speed");
  };
  speed(all.encode, "the encode speed");
  speed(all.decode, "the decode speed");
  const double learned = bitsd(all.learned_seconds);
  if (!std::isfinite(learned) || learned < 0) bad("the learned seconds are not finite");
  if (all.sent > n) bad(std::to_string(all.sent) + " entries of " + std::to_string(n));
  if (all.bytes > max_bytes) {
    bad("a payload of " + std::to_string(all.bytes) + " bytes where the codec makes at most " +
        std::to_string(max_bytes));
  }
}

bool sum_cannot_overflow(int ranks, std::uint64_t magnitude) {
  if (magnitude >= kNotMeasured || ranks < 1) return false;
  const double m = bits_float(static_cast<std::uint32_t>(magnitude));
  return m * ranks <= std::numeric_limits<float>::max() / 2.0;
}

}  // namespace gcomp::detail
