// The agreement's watched wait (stall.hpp).
#include "stall.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "env_setting.hpp"
#include "gcomp/error.hpp"
#include "mpi_util.hpp"

namespace gcomp::detail {

namespace {
constexpr int kTagQuery = 7401;   // {call the asker waits at, 0}
constexpr int kTagAnswer = 7402;  // {call asked about, call the answerer waits at}
constexpr double kLook = 1e-3;    // seconds between looks for questions

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

StallWatch::~StallWatch() {
  if (comm_ == MPI_COMM_NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Request& r : sends_) {
    if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);  // small sends: buffered, or never matched
  }
  MPI_Comm_free(&comm_);
}

void StallWatch::init(MPI_Comm comm) {
  GCOMP_CHECK_MPI(MPI_Comm_dup(comm, &comm_));
  GCOMP_CHECK_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  where_.assign(static_cast<std::size_t>(size_), -1);
}

void StallWatch::send(int to, int tag, std::uint64_t a, std::uint64_t b) {
  // Done sends give back their buffers first (the deque keeps the others' addresses).
  while (!sends_.empty()) {
    int done = 0;
    GCOMP_CHECK_MPI(MPI_Test(&sends_.front(), &done, MPI_STATUS_IGNORE));
    if (!done) break;
    sends_.pop_front();
    out_.pop_front();
  }
  out_.push_back({a, b});
  sends_.emplace_back();
  GCOMP_CHECK_MPI(MPI_Isend(out_.back().data(), 2, MPI_UINT64_T, to, tag, comm_, &sends_.back()));
}

bool StallWatch::receive(Message& m, MPI_Status& st) {
  int found = 0;
  GCOMP_CHECK_MPI(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &found, &st));
  if (!found) return false;
  GCOMP_CHECK_MPI(
      MPI_Recv(m.data(), 2, MPI_UINT64_T, st.MPI_SOURCE, st.MPI_TAG, comm_, MPI_STATUS_IGNORE));
  return true;
}

void StallWatch::serve(std::uint64_t call) {
  Message m{};
  MPI_Status st;
  while (receive(m, st)) {
    if (st.MPI_TAG == kTagQuery) {
      send(st.MPI_SOURCE, kTagAnswer, m[0], call);
    } else if (st.MPI_TAG == kTagAnswer && m[0] == call) {
      where_[static_cast<std::size_t>(st.MPI_SOURCE)] = static_cast<std::int64_t>(m[1]);
    }
  }
}

void StallWatch::drop() {
  Message m{};
  MPI_Status st;
  while (receive(m, st)) {
  }
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

void StallWatch::wait(MPI_Request& request, std::uint64_t call, const WaitLimits& limits,
                      const std::function<std::string()>& describe) {
  int done = 0;
  GCOMP_CHECK_MPI(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
  if (done) return drop();
  const double start = now();
  const double first = first_limit(limits);
  double next_look = start + kLook;
  bool asked = false, reported = false;
  int naps = 0;
  for (;;) {
    GCOMP_CHECK_MPI(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return drop();
    const double t = now();
    if (t >= next_look) {
      next_look = t + kLook;
      serve(call);
      const double waited = t - start;
      if (!asked && first > 0 && waited >= first / 2) {
        asked = true;
        where_.assign(static_cast<std::size_t>(size_), -1);
        for (int r = 0; r < size_; ++r) {
          if (r != rank_) send(r, kTagQuery, call, 0);
        }
      }
      const bool timed_out = limits.timeout > 0 && waited >= limits.timeout;
      if (timed_out || (!reported && limits.stall > 0 && waited >= limits.stall)) {
        const std::string where = absent_ranks(where_, rank_, call);
        const std::string what = "call " + std::to_string(call) + " (" + describe() + ")";
        if (timed_out) throw timeout_error(rank_, waited, what, where);
        reported = true;
        report_stall(rank_, waited, what, where);
      }
    }
    pause_between_polls(naps, start);
  }
}

}  // namespace gcomp::detail
