// gcomp_allreduce / gcomp_last_stats (include/gcomp/gcomp_mpi.h). The Communicator for an
// MPI_Comm lives in an attribute of that communicator, so it is created on the first call (all
// ranks make that call together) and destroyed when the user frees the communicator.
#include <cstring>
#include <memory>
#include <string>

#include "c_handles.hpp"
#include "communicator_for.hpp"
#include "gcomp/communicator.hpp"
#include "gcomp/gcomp_mpi.h"

namespace {

thread_local gcomp_stats last_stats{};

int delete_communicator(MPI_Comm, int, void* value, void*) {
  delete static_cast<gcomp::Communicator*>(value);
  return MPI_SUCCESS;
}

int keyval() {
  static int k = [] {
    int kv = MPI_KEYVAL_INVALID;
    MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &delete_communicator, &kv, nullptr);
    return kv;
  }();
  return k;
}

}  // namespace

namespace gcomp::detail {

gcomp::Communicator& communicator_for(MPI_Comm comm) {
  void* value = nullptr;
  int found = 0;
  const int rc = MPI_Comm_get_attr(comm, keyval(), &value, &found);
  if (rc != MPI_SUCCESS) throw gcomp::Error(gcomp::Status::mpi, "MPI_Comm_get_attr failed");
  if (found) return *static_cast<gcomp::Communicator*>(value);
  auto created = std::make_unique<gcomp::Communicator>(comm);
  if (MPI_Comm_set_attr(comm, keyval(), created.get()) != MPI_SUCCESS) {
    throw gcomp::Error(gcomp::Status::mpi, "MPI_Comm_set_attr failed");
  }
  return *created.release();
}

}  // namespace gcomp::detail

extern "C" {

gcomp_status gcomp_allreduce(const float* sendbuf, float* recvbuf, size_t count, gcomp_codec codec,
                             gcomp_ef ef, uint64_t seed, MPI_Comm comm) {
  using gcomp::detail::set_last_error;
  last_stats = gcomp_stats{};
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return set_last_error(GCOMP_ERR_MPI, "gcomp_allreduce: MPI is not initialized");
  if (comm == MPI_COMM_NULL) {
    return set_last_error(GCOMP_ERR_INVALID_ARGUMENT, "gcomp_allreduce: comm is MPI_COMM_NULL");
  }
  return gcomp::detail::guarded([&]() -> gcomp_status {
    gcomp::Communicator& c = gcomp::detail::communicator_for(comm);
    // Bad arguments still take part in the call, so that the other ranks do not wait.
    std::string bad;
    if (!codec) bad = "codec is NULL";
    else if ((!sendbuf || !recvbuf) && count > 0) bad = "sendbuf or recvbuf is NULL";
    else if (ef && ef->ef.size() != count) {
      bad = "ef holds " + std::to_string(ef->ef.size()) + " elements, count is " + std::to_string(count);
    }
    if (!bad.empty()) {
      c.abandon(gcomp::Status::invalid_argument, "gcomp_allreduce: " + bad);
      return set_last_error(GCOMP_ERR_INVALID_ARGUMENT, "gcomp_allreduce: " + bad);
    }
    gcomp::AllreduceOptions opt;
    opt.seed = seed;
    opt.allow_uncompressed = false;  // the codec is always applied, as gcomp_mpi.h documents
    c.allreduce({sendbuf, count}, {recvbuf, count}, codec->codec, ef ? &ef->ef : nullptr, opt);
    const gcomp::CallStats& s = c.last_stats();
    last_stats.bytes_sent = s.bytes_sent;
    last_stats.bytes_received = s.bytes_received;
    last_stats.encode_seconds = s.encode_seconds;
    last_stats.comm_seconds = s.comm_seconds;
    last_stats.decode_seconds = s.decode_seconds;
    std::strncpy(last_stats.algorithm, gcomp::algorithm_name(s.algorithm),
                 sizeof last_stats.algorithm - 1);
    return GCOMP_OK;
  });
}

gcomp_status gcomp_last_stats(gcomp_stats* out) {
  if (!out) return gcomp::detail::set_last_error(GCOMP_ERR_INVALID_ARGUMENT, "gcomp_last_stats: out is NULL");
  *out = last_stats;
  return GCOMP_OK;
}

}  // extern "C"
