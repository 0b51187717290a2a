// The MPI transport (../transport.hpp): a duplicated communicator, the waits of mpi_util.cpp
// (which follow the wait policy), the agreement as MPI_Iallreduce of int64 MAX watched by
// StallWatch (stall.hpp) on a second duplicate, and the hosts from MPI's shared-memory split (or
// GCOMP_HOST's names).
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fnv.hpp"
#include "gcomp/error.hpp"
#include "mpi_transport.hpp"
#include "mpi_util.hpp"
#include "stall.hpp"
#include "transport.hpp"

namespace gcomp::detail {

namespace {

struct MpiType {
  MPI_Datatype type;
  MPI_Op op;
};

MpiType mpi_type(Reduction r) {
  switch (r) {
    case Reduction::sum_float:
      return {MPI_FLOAT, MPI_SUM};
    case Reduction::sum_uint64:
      return {MPI_UINT64_T, MPI_SUM};
    case Reduction::max_double:
      return {MPI_DOUBLE, MPI_MAX};
    case Reduction::max_int64:
      break;
  }
  return {MPI_INT64_T, MPI_MAX};
}

// The agreement buffers of transports that timed out: MPI may still write them (a posted
// collective cannot be cancelled), so they are kept, reachable, until the process ends.
void keep_until_exit(std::unique_ptr<std::uint64_t[]> buffers) {
  static std::mutex lock;
  static auto* kept = new std::vector<std::unique_ptr<std::uint64_t[]>>();
  const std::lock_guard<std::mutex> hold(lock);
  kept->push_back(std::move(buffers));
}

int rank_of(MPI_Comm comm) {
  int r = 0;
  GCOMP_CHECK_MPI(MPI_Comm_rank(comm, &r));
  return r;
}
int size_of(MPI_Comm comm) {
  int s = 1;
  GCOMP_CHECK_MPI(MPI_Comm_size(comm, &s));
  return s;
}

class MpiTransport final : public Net {
 public:
  // comm_ is the duplicate; the watch makes its own.
  explicit MpiTransport(MPI_Comm dup)
      : Net(gcomp::Transport::mpi, rank_of(dup), size_of(dup)), comm_(dup) {
    watch_.init(comm_);
    // A host is named by its lowest rank: the first of MPI's shared-memory split, or where
    // GCOMP_HOST names this process's host, the first rank of that name (ranks that name none
    // keep the split's hosts among themselves).
    MPI_Comm node;
    GCOMP_CHECK_MPI(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    int split_host = rank();
    MPI_Bcast(&split_host, 1, MPI_INT, 0, node);
    GCOMP_CHECK_MPI(MPI_Comm_size(node, &machine_ranks_));
    MPI_Comm_free(&node);
    const char* named = std::getenv("GCOMP_HOST");
    // [0]: the name's hash (0: none), [1]: the split's host.
    const std::uint64_t mine[2] = {named && *named ? Fnv{}.add(named).h | 1 : 0,
                                   static_cast<std::uint64_t>(split_host)};
    std::vector<std::uint64_t> all(2 * static_cast<std::size_t>(size()));
    GCOMP_CHECK_MPI(MPI_Allgather(mine, 2, MPI_UINT64_T, all.data(), 2, MPI_UINT64_T, comm_));
    hosts_.assign(static_cast<std::size_t>(size()), 0);
    for (std::size_t r = 0; r < hosts_.size(); ++r) {
      std::size_t first = 0;
      while (all[2 * first] != all[2 * r] ||
             (all[2 * r] == 0 && all[2 * first + 1] != all[2 * r + 1])) {
        ++first;
      }
      hosts_[r] = static_cast<int>(first);
    }
  }

  ~MpiTransport() override {
    // After a timeout the agreement is still posted on comm_: freeing it could wait for it.
    if (broken_) {
      keep_until_exit(std::move(agreement_));
      return;
    }
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  MPI_Comm comm() const noexcept { return comm_; }

  void allreduce(const void* send, void* recv, std::size_t count, Reduction op) override {
    const MpiType t = mpi_type(op);
    detail::allreduce(send == recv ? MPI_IN_PLACE : send, recv, static_cast<MPI_Count>(count),
                      t.type, t.op, comm_);
  }
  void barrier() override { detail::barrier(comm_); }
  void allgatherv_bytes(std::span<const std::byte> mine, Gathered& out, Traffic& t) override {
    detail::allgatherv_bytes(comm_, mine, out, t);
  }
  void alltoallv_bytes(const std::vector<std::vector<std::byte>>& to,
                       std::vector<std::vector<std::byte>>& from, Traffic& t) override {
    detail::alltoallv_bytes(comm_, to, from, t);
  }
  void send_bytes(int to, std::span<const std::byte> send, Traffic& t) override {
    detail::send_bytes(comm_, to, send, t);
  }
  void recv_bytes(int from, std::vector<std::byte>& recv, Traffic& t) override {
    detail::recv_bytes(comm_, from, recv, t);
  }
  using Net::sendrecv_bytes;
  void sendrecv_bytes(int to, std::span<const std::byte> send, int from,
                      std::vector<std::byte>& recv, Traffic& t) override {
    detail::sendrecv_bytes(comm_, to, send, from, recv, t);
  }
  void shift_bytes(int to, std::span<const std::byte> send, int from,
                   std::span<std::byte> recv) override {
    constexpr int kTagShift = 7302;
    MPI_Request reqs[2];
    GCOMP_CHECK_MPI(MPI_Irecv_c(recv.data(), static_cast<MPI_Count>(recv.size()), MPI_BYTE, from,
                                kTagShift, comm_, &reqs[0]));
    GCOMP_CHECK_MPI(MPI_Isend_c(send.data(), static_cast<MPI_Count>(send.size()), MPI_BYTE, to,
                                kTagShift, comm_, &reqs[1]));
    detail::wait_all(reqs);
  }
  void alltoall_bytes(std::span<const std::byte> send, std::span<std::byte> recv,
                      std::size_t block) override {
    MPI_Request req;
    GCOMP_CHECK_MPI(MPI_Ialltoall_c(send.data(), static_cast<MPI_Count>(block), MPI_BYTE,
                                    recv.data(), static_cast<MPI_Count>(block), MPI_BYTE, comm_,
                                    &req));
    detail::wait(req);
  }

  void agree(const std::uint64_t* mine, std::uint64_t* all, std::size_t words, std::uint64_t call,
             const WaitLimits& limits, const std::function<std::string()>& describe) override {
    if (limits.stall <= 0 && limits.timeout <= 0) {
      detail::allreduce(mine, all, static_cast<MPI_Count>(words), MPI_INT64_T, MPI_MAX, comm_);
      return;
    }
    // Watched (stall.hpp): in the transport's own buffers, which outlive a timeout.
    if (!agreement_) agreement_ = std::make_unique<std::uint64_t[]>(2 * words);
    std::uint64_t* buf = agreement_.get();
    std::copy(mine, mine + words, buf);
    MPI_Request req;
    GCOMP_CHECK_MPI(MPI_Iallreduce(buf, buf + words, static_cast<int>(words), MPI_INT64_T, MPI_MAX,
                                   comm_, &req));
    try {
      watch_.wait(req, call, limits, describe);
      // With a timeout, a second step: a rank that came after the others had given up completes
      // the agreement (their contributions are posted) and would go on into the call's
      // exchanges, which they never join. No rank passes the barrier until every rank has
      // completed the agreement in time; a rank that timed out never joins it, so the late rank
      // times out here.
      if (limits.timeout > 0 && size() > 1) {
        GCOMP_CHECK_MPI(MPI_Ibarrier(comm_, &req));
        watch_.wait(req, call, limits, [&] {
          return describe() +
                 "; past its agreement, which every rank had come to: a rank not "
                 "there gave up on this call before this rank came";
        });
      }
    } catch (const Error& e) {
      if (e.code() == Status::timeout) broken_ = true;
      throw;
    }
    std::copy(buf + words, buf + 2 * words, all);
  }

 private:
  MPI_Comm comm_;
  StallWatch watch_;
  std::unique_ptr<std::uint64_t[]> agreement_;  // 2 x words: this rank's, then the MAX
  bool broken_ = false;                         // a watched wait timed out
};

}  // namespace

MPI_Comm mpi_comm_of(const Net& net) noexcept {
  const auto* mpi = dynamic_cast<const MpiTransport*>(&net);
  return mpi ? mpi->comm() : MPI_COMM_NULL;
}

std::unique_ptr<Net> make_mpi_transport(MPI_Comm comm) {
  if (comm == MPI_COMM_NULL) throw Error(Status::invalid_argument, "communicator is MPI_COMM_NULL");
  MPI_Comm dup;
  GCOMP_CHECK_MPI(MPI_Comm_dup(comm, &dup));
  GCOMP_CHECK_MPI(MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN));
  try {
    return std::make_unique<MpiTransport>(dup);
  } catch (...) {
    MPI_Comm_free(&dup);
    throw;
  }
}

}  // namespace gcomp::detail
