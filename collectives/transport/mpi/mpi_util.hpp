// MPI plumbing for the MPI transport (transport_mpi.cpp): error checks that become gcomp::Error,
// waits that follow the wait mode (waiting.hpp), and byte exchanges that count what they hand to
// MPI.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "gcomp/collective_types.hpp"
#include "transport.hpp"
#include "waiting.hpp"

namespace gcomp::detail {

[[noreturn]] void throw_mpi(int rc, const char* call, const char* file, int line);

#define GCOMP_CHECK_MPI(call)                                           \
  do {                                                                  \
    const int gcomp_rc_ = (call);                                       \
    if (gcomp_rc_ != MPI_SUCCESS) {                                     \
      ::gcomp::detail::throw_mpi(gcomp_rc_, #call, __FILE__, __LINE__); \
    }                                                                   \
  } while (0)

// Completes requests as the wait policy says (waiting.hpp): spin blocks in MPI_Wait, which spins
// on its own core without the cost of a system call; yield and sleep poll MPI_Test (poll_until).
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

}  // namespace gcomp::detail
