// The wait policy (gcomp::WaitPolicy): what the user set, and its resolution into the mode every
// transport's waits follow (waiting.hpp).
#include "waiting.hpp"

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <string>

#include "env_setting.hpp"
#include "gcomp/collective_types.hpp"
#include "gcomp/error.hpp"

namespace gcomp {

namespace {
std::atomic<int> chosen{static_cast<int>(WaitPolicy::automatic)};
std::atomic<bool> oversubscribed{false};
constexpr const char* kNames[] = {"auto", "spin", "yield", "sleep"};
}  // namespace

const char* wait_policy_name(WaitPolicy policy) noexcept {
  const int i = static_cast<int>(policy);
  return i >= 0 && i < 4 ? kNames[i] : "unknown";
}

WaitPolicy parse_wait_policy(std::string_view name) {
  for (int i = 0; i < 4; ++i) {
    if (name == kNames[i]) return static_cast<WaitPolicy>(i);
  }
  throw Error(Status::invalid_argument,
              "unknown wait policy '" + std::string(name) + "' (known: auto, spin, yield, sleep)");
}

WaitPolicy wait_policy() noexcept { return static_cast<WaitPolicy>(chosen.load()); }

WaitPolicy effective_wait_policy() noexcept { return detail::wait_mode(); }

void set_wait_policy(WaitPolicy policy) noexcept {
  chosen.store(static_cast<int>(policy));
  if (policy != WaitPolicy::automatic) {
    detail::set_wait_mode(policy);
    return;
  }
  // automatic: as the last Communicator found (a bad GCOMP_WAIT is reported when one is made).
  try {
    detail::apply_wait_policy();
  } catch (const Error&) {
    detail::set_wait_mode(oversubscribed.load() ? WaitPolicy::yield : WaitPolicy::spin);
  }
}

namespace detail {

namespace {
std::atomic<int> mode_flag{static_cast<int>(WaitPolicy::spin)};
}

void set_wait_mode(WaitPolicy mode) noexcept {
  mode_flag.store(static_cast<int>(mode == WaitPolicy::automatic ? WaitPolicy::spin : mode));
}
WaitPolicy wait_mode() noexcept {
  return static_cast<WaitPolicy>(mode_flag.load(std::memory_order_relaxed));
}

void pause_between_polls(int& naps, double start) noexcept {
  if (wait_mode() != WaitPolicy::sleep) {
    sched_yield();
    return;
  }
  // Small messages arrive within tens of microseconds: poll that long, then sleep between polls,
  // 10 us doubling to 100 us (a link's socket buffers keep it busy far longer than that), longer
  // as the wait grows.
  const double waited = now() - start;
  if (waited < 20e-6) return;
  const timespec nap{0, nap_nanoseconds(naps, waited)};
  naps = std::min(naps + 1, 4);
  nanosleep(&nap, nullptr);
}

long nap_nanoseconds(int naps, double waited) noexcept {
  const long grown = std::min(100000L, 10000L << std::clamp(naps, 0, 4));
  const double eighth = std::clamp(waited / 8, 0.0, 1e-3) * 1e9;
  return std::max(grown, static_cast<long>(eighth));
}

void note_oversubscribed() noexcept { oversubscribed.store(true); }

void apply_wait_policy() {
  WaitPolicy p = wait_policy();
  if (p == WaitPolicy::automatic) p = env_setting("GCOMP_WAIT", parse_wait_policy).value_or(p);
  if (p == WaitPolicy::automatic) p = oversubscribed.load() ? WaitPolicy::yield : WaitPolicy::spin;
  set_wait_mode(p);
}

}  // namespace detail

}  // namespace gcomp
