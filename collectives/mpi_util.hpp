// MPI plumbing for the collectives: error checks that become gcomp::Error, waits that yield the
// CPU between polls (on an oversubscribed node a spinning rank would steal the timeslice the
// rank it waits for needs: 8 ms per barrier at 4 ranks on 2 cores, 15 us with yielding), and
// byte exchanges that count what they hand to MPI.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace gcomp::detail {

[[noreturn]] void throw_mpi(int rc, const char* call, const char* file, int line);

#define GCOMP_CHECK_MPI(call)                                                  \
  do {                                                                         \
    const int gcomp_rc_ = (call);                                              \
    if (gcomp_rc_ != MPI_SUCCESS) {                                            \
      ::gcomp::detail::throw_mpi(gcomp_rc_, #call, __FILE__, __LINE__);        \
    }                                                                          \
  } while (0)

// Bytes handed to and delivered by MPI, and the seconds spent in it.
struct Traffic {
  std::uint64_t sent = 0;
  std::uint64_t received = 0;
  double seconds = 0;
};

// Completes requests. When ranks outnumber this node's cores (set_yielding(true), decided by
// the Communicator), polls with MPI_Test and yields the CPU between polls; otherwise blocks in
// MPI_Wait, which spins on its own core without the cost of a system call.
void set_yielding(bool yield) noexcept;
bool yielding() noexcept;
void wait(MPI_Request& request);
void wait_all(std::span<MPI_Request> requests);
// MPI_Ibarrier, then wait() (so a barrier yields like every other wait).
void barrier(MPI_Comm comm);
// MPI_Allreduce_c when waits need not yield (MPICH's blocking algorithms, which are also a
// little faster for small messages than its nonblocking schedules), else MPI_Iallreduce_c and
// wait(). sendbuf may be MPI_IN_PLACE.
void allreduce(const void* sendbuf, void* recvbuf, MPI_Count count, MPI_Datatype type, MPI_Op op,
               MPI_Comm comm);

// Every rank's bytes, concatenated in rank order; offsets[r] and sizes[r] locate rank r's.
struct Gathered {
  std::vector<std::byte> bytes;
  std::vector<std::uint64_t> sizes;
  std::vector<std::uint64_t> offsets;
  std::span<const std::byte> of(int r) const {
    return {bytes.data() + offsets[static_cast<std::size_t>(r)],
            static_cast<std::size_t>(sizes[static_cast<std::size_t>(r)])};
  }
};
void allgatherv_bytes(MPI_Comm comm, std::span<const std::byte> mine, Gathered& out,
                      Traffic& t);

// to[r] goes to rank r; from[r] arrives from rank r (to[rank] is copied locally).
void alltoallv_bytes(MPI_Comm comm, const std::vector<std::vector<std::byte>>& to,
                     std::vector<std::vector<std::byte>>& from, Traffic& t);

// Sends `send` to partner and receives its message (any size) into recv.
void sendrecv_bytes(MPI_Comm comm, int partner, std::span<const std::byte> send,
                    std::vector<std::byte>& recv, Traffic& t);
void send_bytes(MPI_Comm comm, int to, std::span<const std::byte> send, Traffic& t);
void recv_bytes(MPI_Comm comm, int from, std::vector<std::byte>& recv, Traffic& t);

// Seconds since an arbitrary start (MPI_Wtime).
inline double now() { return MPI_Wtime(); }

}  // namespace gcomp::detail
