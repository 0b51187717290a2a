// What every transport's stall watch shares (mpi/stall.hpp, gloo/): the limits a rank waits at
// the agreement under, and the words of the stall report and the timeout's error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gcomp/error.hpp"
#include "transport.hpp"

namespace gcomp::detail {

// GCOMP_STALL_SECONDS and GCOMP_TIMEOUT_SECONDS over the defaults; Error(invalid_argument) for
// a value that is not a finite number >= 0.
WaitLimits wait_limits_from_env();
// Error(invalid_argument) naming `what` unless seconds is finite and >= 0.
void check_wait_seconds(double seconds, const char* what);

// The seconds a watch first acts at: the sooner of the two limits that are set (0: neither).
double first_limit(const WaitLimits& limits) noexcept;
// "rank 1 (at no gcomp call), rank 2 (at call 17)": the ranks of where (per rank: the call it
// said it waits at, or -1) not at `call`, this rank left out; "" when every rank is there.
std::string absent_ranks(const std::vector<std::int64_t>& where, int rank, std::uint64_t call);
// The stall report, printed once to stderr, and the timeout's error, in the words both
// transports use. what: "call N (describe())"; absent: absent_ranks().
void report_stall(int rank, double waited, const std::string& what, const std::string& absent);
Error timeout_error(int rank, double waited, const std::string& what, const std::string& absent);

}  // namespace gcomp::detail
