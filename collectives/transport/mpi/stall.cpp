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
}  // namespace

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
