// Thread count setting (see parallel.hpp).
#include "parallel.hpp"

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <string>

#include "gcomp/error.hpp"
#include "simd.hpp"

namespace gcomp {

namespace {
// GCOMP_NUM_THREADS: unset or empty means 1; anything but an integer in 1..4096 is an error,
// reported by check_environment() (a bad value must not silently become a default).
struct EnvThreads {
  int threads = 1;
  std::string error;
};

const EnvThreads& env_threads() {
  static const EnvThreads e = [] {
    EnvThreads r;
    const char* v = std::getenv("GCOMP_NUM_THREADS");
    if (!v || !*v) return r;
    char* end = nullptr;
    errno = 0;
    const long t = std::strtol(v, &end, 10);
    if (*end != '\0' || errno != 0 || t < 1 || t > 4096) {
      r.error = std::string("GCOMP_NUM_THREADS='") + v + "' is not an integer in 1..4096";
      return r;
    }
    r.threads = static_cast<int>(t);
    return r;
  }();
  return e;
}

std::atomic<int>& thread_setting() {
  static std::atomic<int> t{env_threads().threads};
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

void check_environment() { detail::check_environment(); }

namespace detail {
void check_environment() {
  const EnvThreads& e = env_threads();
  if (!e.error.empty()) throw Error(Status::invalid_argument, e.error);
  if (!simd_environment_error().empty()) {
    throw Error(Status::invalid_argument, simd_environment_error());
  }
}

int threads_for(std::size_t elements) noexcept {
  constexpr std::size_t kMinPerThread = std::size_t{1} << 18;
  const std::size_t by_work = elements / kMinPerThread;
  const int t = num_threads();
  if (by_work < 2) return 1;
  return by_work < static_cast<std::size_t>(t) ? static_cast<int>(by_work) : t;
}
}  // namespace detail

}  // namespace gcomp
