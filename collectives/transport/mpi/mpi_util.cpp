// MPI plumbing (see mpi_util.hpp). Large-count (MPI-4 "_c") calls throughout, so no message is
// limited to 2 GiB.
#include "mpi_util.hpp"

#include <algorithm>
#include <string>

#include "gcomp/error.hpp"

namespace gcomp::detail {

namespace {
constexpr int kTagPoint = 7301;  // point-to-point messages of the sparse algorithms
constexpr int kTagAll = 7303;    // the all-to-all's messages
}  // namespace

void throw_mpi(int rc, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(Status::mpi, std::string(call) + " failed (" + std::string(text, len) + ") at " +
                               file + ":" + std::to_string(line));
}

void wait(MPI_Request& request) {
  if (!yielding()) {
    GCOMP_CHECK_MPI(MPI_Wait(&request, MPI_STATUS_IGNORE));
    return;
  }
  poll_until([&] {
    int done = 0;
    GCOMP_CHECK_MPI(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    return done != 0;
  });
}

void barrier(MPI_Comm comm) {
  MPI_Request req;
  GCOMP_CHECK_MPI(MPI_Ibarrier(comm, &req));
  wait(req);
}

void allreduce(const void* sendbuf, void* recvbuf, MPI_Count count, MPI_Datatype type, MPI_Op op,
               MPI_Comm comm) {
  if (!yielding()) {
    GCOMP_CHECK_MPI(MPI_Allreduce_c(sendbuf, recvbuf, count, type, op, comm));
    return;
  }
  MPI_Request req;
  GCOMP_CHECK_MPI(MPI_Iallreduce_c(sendbuf, recvbuf, count, type, op, comm, &req));
  wait(req);
}

void wait_all(std::span<MPI_Request> requests) {
  if (!yielding()) {
    GCOMP_CHECK_MPI(
        MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE));
    return;
  }
  poll_until([&] {
    int done = 0;
    GCOMP_CHECK_MPI(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done,
                                MPI_STATUSES_IGNORE));
    return done != 0;
  });
}

void allgatherv_bytes(MPI_Comm comm, std::span<const std::byte> mine, Gathered& out, Traffic& t) {
  int size = 1, rank = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &rank);
  const auto p = static_cast<std::size_t>(size);
  const double start = now();
  out.sizes.assign(p, 0);
  const std::uint64_t my_size = mine.size();
  MPI_Request req;
  GCOMP_CHECK_MPI(
      MPI_Iallgather(&my_size, 1, MPI_UINT64_T, out.sizes.data(), 1, MPI_UINT64_T, comm, &req));
  wait(req);
  std::vector<MPI_Count> counts(p);
  std::vector<MPI_Aint> displs(p);
  out.offsets.assign(p, 0);
  std::uint64_t total = 0;
  for (std::size_t r = 0; r < p; ++r) {
    check_announced(out.sizes[r], static_cast<int>(r));
    check_announced(total + out.sizes[r], static_cast<int>(r));
    out.offsets[r] = total;
    counts[r] = static_cast<MPI_Count>(out.sizes[r]);
    displs[r] = static_cast<MPI_Aint>(total);
    total += out.sizes[r];
  }
  out.bytes.resize(total);
  GCOMP_CHECK_MPI(MPI_Iallgatherv_c(mine.data(), static_cast<MPI_Count>(mine.size()), MPI_BYTE,
                                    out.bytes.data(), counts.data(), displs.data(), MPI_BYTE, comm,
                                    &req));
  wait(req);
  wire_done(t, start);
  count_allgatherv(t, p, my_size, total);
}

void alltoallv_bytes(MPI_Comm comm, const std::vector<std::vector<std::byte>>& to,
                     std::vector<std::vector<std::byte>>& from, Traffic& t) {
  int size = 1, rank = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &rank);
  const auto p = static_cast<std::size_t>(size);
  const double start = now();
  std::vector<std::uint64_t> send_sizes(p), recv_sizes(p);
  for (std::size_t r = 0; r < p; ++r) send_sizes[r] = to[r].size();
  MPI_Request req;
  GCOMP_CHECK_MPI(MPI_Ialltoall(send_sizes.data(), 1, MPI_UINT64_T, recv_sizes.data(), 1,
                                MPI_UINT64_T, comm, &req));
  wait(req);
  // The data by point-to-point: receives posted first, sends staggered (rank + 1, rank + 2, ...)
  // so that no rank is the target of everyone at once. MPICH's Ialltoallv was slower here.
  const auto me = static_cast<std::size_t>(rank);
  from.resize(p);
  std::vector<MPI_Request> reqs;
  reqs.reserve(2 * p);
  for (std::size_t k = 1; k < p; ++k) {
    const std::size_t r = (me + p - k) % p;
    check_announced(recv_sizes[r], static_cast<int>(r));
    from[r].resize(recv_sizes[r]);
    reqs.emplace_back();
    GCOMP_CHECK_MPI(MPI_Irecv_c(from[r].data(), static_cast<MPI_Count>(recv_sizes[r]), MPI_BYTE,
                                static_cast<int>(r), kTagAll, comm, &reqs.back()));
  }
  for (std::size_t k = 1; k < p; ++k) {
    const std::size_t r = (me + k) % p;
    reqs.emplace_back();
    GCOMP_CHECK_MPI(MPI_Isend_c(to[r].data(), static_cast<MPI_Count>(to[r].size()), MPI_BYTE,
                                static_cast<int>(r), kTagAll, comm, &reqs.back()));
  }
  from[me].assign(to[me].begin(), to[me].end());
  wait_all(reqs);
  wire_done(t, start);
  count_alltoallv(t, send_sizes, recv_sizes, me);
}

void send_bytes(MPI_Comm comm, int to, std::span<const std::byte> send, Traffic& t) {
  const double start = now();
  MPI_Request req;
  GCOMP_CHECK_MPI(MPI_Isend_c(send.data(), static_cast<MPI_Count>(send.size()), MPI_BYTE, to,
                              kTagPoint, comm, &req));
  wait(req);
  wire_done(t, start);
  t.sent += send.size();
}

void recv_bytes(MPI_Comm comm, int from, std::vector<std::byte>& recv, Traffic& t) {
  const double start = now();
  MPI_Message msg;
  MPI_Status status;
  if (!yielding()) {
    GCOMP_CHECK_MPI(MPI_Mprobe(from, kTagPoint, comm, &msg, &status));
  } else {
    poll_until([&] {
      int found = 0;
      GCOMP_CHECK_MPI(MPI_Improbe(from, kTagPoint, comm, &found, &msg, &status));
      return found != 0;
    });
  }
  MPI_Count count = 0;
  GCOMP_CHECK_MPI(MPI_Get_count_c(&status, MPI_BYTE, &count));
  recv.resize(static_cast<std::size_t>(count));
  MPI_Request req;
  GCOMP_CHECK_MPI(MPI_Imrecv_c(recv.data(), count, MPI_BYTE, &msg, &req));
  wait(req);
  wire_done(t, start);
  t.received += static_cast<std::uint64_t>(count);
}

void sendrecv_bytes(MPI_Comm comm, int to, std::span<const std::byte> send, int from,
                    std::vector<std::byte>& recv, Traffic& t) {
  const double start = now();
  MPI_Request req;
  GCOMP_CHECK_MPI(MPI_Isend_c(send.data(), static_cast<MPI_Count>(send.size()), MPI_BYTE, to,
                              kTagPoint, comm, &req));
  Traffic inner;
  recv_bytes(comm, from, recv, inner);
  wait(req);
  wire_done(t, start);
  t.sent += send.size();
  t.received += inner.received;
}

}  // namespace gcomp::detail
