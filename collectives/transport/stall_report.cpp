// The limits and messages every transport's stall watch shares (stall_report.hpp).
#include "stall_report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "env_setting.hpp"

namespace gcomp::detail {

namespace {
double parse_seconds(std::string_view text) {
  const std::string s(text);
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || *end != '\0' || !std::isfinite(v) || v < 0) {
    throw Error(Status::invalid_argument, "not a number of seconds >= 0 (0: never)");
  }
  return v;
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", s);
  return buf;
}
}  // namespace

void check_wait_seconds(double seconds, const char* what) {
  if (!std::isfinite(seconds) || seconds < 0) {
    throw Error(Status::invalid_argument, std::string(what) +
                                              " must be a finite number of "
                                              "seconds >= 0 (0: never), not " +
                                              std::to_string(seconds));
  }
}

WaitLimits wait_limits_from_env() {
  WaitLimits w;
  if (auto v = env_setting("GCOMP_STALL_SECONDS", parse_seconds)) w.stall = *v;
  if (auto v = env_setting("GCOMP_TIMEOUT_SECONDS", parse_seconds)) w.timeout = *v;
  return w;
}

double first_limit(const WaitLimits& limits) noexcept {
  return limits.stall > 0 && limits.timeout > 0 ? std::min(limits.stall, limits.timeout)
                                                : std::max(limits.stall, limits.timeout);
}

std::string absent_ranks(const std::vector<std::int64_t>& where, int rank, std::uint64_t call) {
  std::string out;
  for (int r = 0; r < static_cast<int>(where.size()); ++r) {
    const std::int64_t w = where[static_cast<std::size_t>(r)];
    if (r == rank || w == static_cast<std::int64_t>(call)) continue;
    if (!out.empty()) out += ", ";
    out += "rank " + std::to_string(r) +
           (w < 0 ? std::string(" (at no gcomp call)") : " (at call " + std::to_string(w) + ")");
  }
  return out;
}

namespace {
std::string missing_text(const std::string& absent) {
  return absent.empty() ? std::string("every rank answered it is there") : "not there: " + absent;
}
}  // namespace

void report_stall(int rank, double waited, const std::string& what, const std::string& absent) {
  std::fprintf(stderr, "gcomp: rank %d has waited %s at the start of %s; %s\n", rank,
               seconds_text(waited).c_str(), what.c_str(), missing_text(absent).c_str());
  std::fflush(stderr);
}

Error timeout_error(int rank, double waited, const std::string& what, const std::string& absent) {
  return Error(Status::timeout, "rank " + std::to_string(rank) + " waited " + seconds_text(waited) +
                                    " (the timeout) at the start of " + what + "; " +
                                    missing_text(absent));
}

}  // namespace gcomp::detail
