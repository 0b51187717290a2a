// MPI plumbing for the MPI transport (transport_mpi.cpp): error checks that become gcomp::Error,
// waits that yield the CPU between polls (on an oversubscribed node a spinning rank would steal
// the timeslice the rank it waits for needs: 8 ms per barrier at 4 ranks on 2 cores, 15 us with
// yielding), and byte exchanges that count what they hand to MPI.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "gcomp/communicator.hpp"
#include "transport.hpp"

namespace gcomp::detail {

[[noreturn]] void throw_mpi(int rc, const char* call, const char* file, int line);

#define GCOMP_CHECK_MPI(call)                                           \
  do {                                                                  \
    const int gcomp_rc_ = (call);                                       \
    if (gcomp_rc_ != MPI_SUCCESS) {                                     \
      ::gcomp::detail::throw_mpi(gcomp_rc_, #call, __FILE__, __LINE__); \
    }                                                                   \
  } while (0)

// Completes requests as the wait policy says (gcomp::WaitPolicy; the Communicator resolves
// automatic): spin blocks in MPI_Wait, which spins on its own core without the cost of a system
// call; yield polls MPI_Test and yields the CPU between polls (where ranks outnumber the cores);
// sleep polls for 20 us, then sleeps between polls (beside compute on the same cores).
// set_wait_mode takes spin, yield or sleep.
void set_wait_mode(WaitPolicy mode) noexcept;
// A Communicator found more ranks on its node than cores (the automatic policy then yields).
void note_oversubscribed() noexcept;
// Sets the wait mode from the policy (automatic: GCOMP_WAIT, else yield where oversubscribed,
// else spin). Throws Error(invalid_argument) for an unknown GCOMP_WAIT.
void apply_wait_policy();
WaitPolicy wait_mode() noexcept;
// Whether waits poll (yield or sleep) instead of blocking in MPI.
inline bool yielding() noexcept { return wait_mode() != WaitPolicy::spin; }
// Calls done() until it returns true, between calls yielding or sleeping as the mode says.
template <class Done>
void poll_until(Done&& done);
void wait(MPI_Request& request);
void wait_all(std::span<MPI_Request> requests);
// MPI_Ibarrier, then wait() (so a barrier yields like every other wait).
void barrier(MPI_Comm comm);
// MPI_Allreduce_c when waits need not yield (MPICH's blocking algorithms, which are also a
// little faster for small messages than its nonblocking schedules), else MPI_Iallreduce_c and
// wait(). sendbuf may be MPI_IN_PLACE.
void allreduce(const void* sendbuf, void* recvbuf, MPI_Count count, MPI_Datatype type, MPI_Op op,
               MPI_Comm comm);

void allgatherv_bytes(MPI_Comm comm, std::span<const std::byte> mine, Gathered& out, Traffic& t);

// to[r] goes to rank r; from[r] arrives from rank r (to[rank] is copied locally).
void alltoallv_bytes(MPI_Comm comm, const std::vector<std::vector<std::byte>>& to,
                     std::vector<std::vector<std::byte>>& from, Traffic& t);

// Sends `send` to `to` and receives the message (any size) of `from` into recv, at once.
void sendrecv_bytes(MPI_Comm comm, int to, std::span<const std::byte> send, int from,
                    std::vector<std::byte>& recv, Traffic& t);
void send_bytes(MPI_Comm comm, int to, std::span<const std::byte> send, Traffic& t);
void recv_bytes(MPI_Comm comm, int from, std::vector<std::byte>& recv, Traffic& t);

// One pause of poll_until: sched_yield, or (sleep) nothing for the first 20 us since start,
// then a nap of 10 us << naps, at most 100 us (naps counts them).
void pause_between_polls(int& naps, double start) noexcept;

template <class Done>
void poll_until(Done&& done) {
  int naps = 0;
  const double start = now();
  while (!done()) pause_between_polls(naps, start);
}

}  // namespace gcomp::detail
