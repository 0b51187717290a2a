// libFuzzer target: the agreement (collectives/call/agreement.hpp) as the Communicator reads it after
// the combining allreduce, whose bytes come from every rank. check_agreed() accepts it or throws
// Error(bad_payload), never crashes; what it accepts is what the readers assume: a failure names
// a known status and a rank below the rank count, the speeds are non-negative (or +Inf), the
// learned seconds finite, the entries at most n and the bytes at most the codec's bound; and the
// readers (the failure's status name, the overflow bound, the signatures) run on it.
// Layout of an input: the Agreement's 96 bytes, then a byte for the rank count (1..256), 4 bytes
// of n and 8 of the payload bound. Build with GCOMP_FUZZ=ON (clang).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "agreement.hpp"
#include "gcomp/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using gcomp::detail::Agreement;
  using gcomp::detail::bitsd;
  if (size < sizeof(Agreement) + 1 + 4 + 8) return 0;
  Agreement all{};
  std::memcpy(&all, data, sizeof all);
  const int ranks = 1 + data[sizeof all];
  std::uint32_t n32 = 0;
  std::memcpy(&n32, data + sizeof all + 1, 4);
  std::uint64_t max_bytes = 0;
  std::memcpy(&max_bytes, data + sizeof all + 5, 8);
  const std::uint64_t n = n32;
  try {
    gcomp::detail::check_agreed(all, ranks, n, max_bytes);
  } catch (const gcomp::Error& e) {
    if (e.code() != gcomp::Status::bad_payload) __builtin_trap();
    return 0;
  }
  if (all.any_failed()) {
    if (all.failed_rank() < 0 || all.failed_rank() >= ranks) __builtin_trap();
    if (std::strcmp(gcomp::status_name(all.failed_status()), "unknown") == 0) __builtin_trap();
  }
  for (const std::uint64_t bits : {all.encode, all.decode}) {
    const double v = bitsd(bits);
    if (std::isnan(v) || v < 0) __builtin_trap();
  }
  const double learned = bitsd(all.learned_seconds);
  if (!std::isfinite(learned) || learned < 0) __builtin_trap();
  if (all.sent > n || all.bytes > max_bytes) __builtin_trap();
  (void)gcomp::detail::sum_cannot_overflow(ranks, all.magnitude);
  (void)all.same_signature();
  (void)all.same_state();
  return 0;
}
