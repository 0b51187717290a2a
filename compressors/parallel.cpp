// Thread count setting (see parallel.hpp).
#include "parallel.hpp"

#include <atomic>
#include <cstdlib>
#include <string>

#include "gcomp/error.hpp"

namespace gcomp {

namespace {
int threads_from_env() {
  const char* v = std::getenv("GCOMP_NUM_THREADS");
  if (!v || !*v) return 1;
  char* end = nullptr;
  const long t = std::strtol(v, &end, 10);
  if (*end != '\0' || t < 1 || t > 4096) return 1;  // a bad value must not break a program
  return static_cast<int>(t);
}

std::atomic<int>& thread_setting() {
  static std::atomic<int> t{threads_from_env()};
  return t;
}
}  // namespace

void set_num_threads(int threads) {
  if (threads < 1 || threads > 4096) {
    throw Error(Status::invalid_argument,
                "thread count must be in 1..4096, got " + std::to_string(threads));
  }
  thread_setting().store(threads);
}

int num_threads() noexcept { return thread_setting().load(); }

namespace detail {
int threads_for(std::size_t elements) noexcept {
  constexpr std::size_t kMinPerThread = std::size_t{1} << 18;
  const std::size_t by_work = elements / kMinPerThread;
  const int t = num_threads();
  if (by_work < 2) return 1;
  return by_work < static_cast<std::size_t>(t) ? static_cast<int>(by_work) : t;
}
}  // namespace detail

}  // namespace gcomp
