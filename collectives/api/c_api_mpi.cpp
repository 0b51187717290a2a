// gcomp_allreduce / gcomp_last_stats (include/gcomp/gcomp_mpi.h). The Communicator for an
// MPI_Comm lives in an attribute of that communicator, so it is created on the first call (all
// ranks make that call together) and destroyed when the user frees the communicator.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "c_handles.hpp"
#include "communicator_for.hpp"
#include "gcomp/communicator.hpp"
#include "gcomp/gcomp_mpi.h"

#ifdef GCOMP_HAVE_GLOO
#include <gloo/rendezvous/file_store.h>

#include <filesystem>
#include <system_error>
#endif

struct gcomp_comm_s {
  std::unique_ptr<gcomp::Communicator> comm;
};

namespace {

thread_local gcomp_stats last_stats{};

void keep_stats(const gcomp::CallStats& s) {
  last_stats.bytes_sent = s.bytes_sent;
  last_stats.bytes_received = s.bytes_received;
  last_stats.encode_seconds = s.encode_seconds;
  last_stats.comm_seconds = s.comm_seconds;
  last_stats.decode_seconds = s.decode_seconds;
  std::strncpy(last_stats.algorithm, gcomp::algorithm_name(s.algorithm),
               sizeof last_stats.algorithm - 1);
}

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

// gcomp_allreduce's body on a Communicator: bad arguments still take part in the call, so that
// the other ranks do not wait.
gcomp_status allreduce_on(gcomp::Communicator& c, const char* name, const float* sendbuf,
                          float* recvbuf, size_t count, gcomp_codec codec, gcomp_ef ef,
                          uint64_t seed) {
  using gcomp::detail::set_last_error;
  std::string bad;
  if (!codec)
    bad = "codec is NULL";
  else if ((!sendbuf || !recvbuf) && count > 0)
    bad = "sendbuf or recvbuf is NULL";
  else if (ef && ef->ef.size() != count) {
    bad = "ef holds " + std::to_string(ef->ef.size()) + " elements, count is " +
          std::to_string(count);
  }
  if (!bad.empty()) {
    c.abandon(gcomp::Status::invalid_argument, std::string(name) + ": " + bad);
    return set_last_error(GCOMP_ERR_INVALID_ARGUMENT, std::string(name) + ": " + bad);
  }
  gcomp::AllreduceOptions opt;
  opt.seed = seed;
  opt.allow_uncompressed = false;  // the codec is always applied, as gcomp_mpi.h documents
  c.allreduce({sendbuf, count}, {recvbuf, count}, codec->codec, ef ? &ef->ef : nullptr, opt);
  keep_stats(c.last_stats());
  return GCOMP_OK;
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
    return allreduce_on(gcomp::detail::communicator_for(comm), "gcomp_allreduce", sendbuf, recvbuf,
                        count, codec, ef, seed);
  });
}

gcomp_status gcomp_allreduce_buckets_shaped(float* const* tensors, const size_t* rows,
                                            const size_t* cols, size_t ntensors, gcomp_codec codec,
                                            const gcomp_ef* efs, uint64_t seed, MPI_Comm comm) {
  using gcomp::detail::set_last_error;
  last_stats = gcomp_stats{};
  const char* const name = "gcomp_allreduce_buckets_shaped: ";
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized)
    return set_last_error(GCOMP_ERR_MPI, std::string(name) + "MPI is not initialized");
  if (comm == MPI_COMM_NULL) {
    return set_last_error(GCOMP_ERR_INVALID_ARGUMENT, std::string(name) + "comm is MPI_COMM_NULL");
  }
  return gcomp::detail::guarded([&]() -> gcomp_status {
    gcomp::Communicator& c = gcomp::detail::communicator_for(comm);
    std::string bad;
    if (!codec)
      bad = "codec is NULL";
    else if (ntensors > 0 && (!tensors || !rows || !cols))
      bad = "tensors, rows or cols is NULL";
    std::vector<std::span<float>> views;
    std::vector<gcomp::MatrixShape> shapes;
    std::vector<gcomp::ErrorFeedback*> memories;
    for (size_t t = 0; bad.empty() && t < ntensors; ++t) {
      const size_t n = rows[t] * cols[t];
      if (cols[t] != 0 && n / cols[t] != rows[t]) {
        bad = "tensor " + std::to_string(t) + "'s rows x cols overflows";
      } else if (!tensors[t] && n > 0) {
        bad = "tensor " + std::to_string(t) + " is NULL";
      } else {
        views.emplace_back(tensors[t], n);
        shapes.push_back({rows[t], cols[t]});
        if (efs) memories.push_back(efs[t] ? &efs[t]->ef : nullptr);
      }
    }
    if (!bad.empty()) {
      c.abandon(gcomp::Status::invalid_argument, name + bad);
      return set_last_error(GCOMP_ERR_INVALID_ARGUMENT, name + bad);
    }
    gcomp::BucketOptions opt;
    opt.allreduce.seed = seed;
    opt.allreduce.allow_uncompressed = false;  // the codec is always applied, as gcomp_allreduce
    c.allreduce_buckets(views, shapes, codec->codec, memories, opt);
    keep_stats(c.last_stats());
    return GCOMP_OK;
  });
}

gcomp_status gcomp_comm_create_mpi(MPI_Comm comm, gcomp_comm* out) {
  using gcomp::detail::set_last_error;
  if (!out) return set_last_error(GCOMP_ERR_INVALID_ARGUMENT, "gcomp_comm_create_mpi: out is NULL");
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    return set_last_error(GCOMP_ERR_MPI, "gcomp_comm_create_mpi: MPI is not initialized");
  }
  if (comm == MPI_COMM_NULL) {
    return set_last_error(GCOMP_ERR_INVALID_ARGUMENT,
                          "gcomp_comm_create_mpi: comm is MPI_COMM_NULL");
  }
  return gcomp::detail::guarded([&]() -> gcomp_status {
    auto h = std::make_unique<gcomp_comm_s>();
    h->comm = std::make_unique<gcomp::Communicator>(comm);
    *out = h.release();
    return GCOMP_OK;
  });
}

gcomp_status gcomp_comm_create_gloo(const char* dir, const char* prefix, int rank, int size,
                                    gcomp_comm* out) {
  using gcomp::detail::set_last_error;
  const char* const name = "gcomp_comm_create_gloo: ";
  if (!out) return set_last_error(GCOMP_ERR_INVALID_ARGUMENT, std::string(name) + "out is NULL");
  if (!dir || !*dir) {
    return set_last_error(GCOMP_ERR_INVALID_ARGUMENT, std::string(name) + "dir is NULL or empty");
  }
#ifdef GCOMP_HAVE_GLOO
  return gcomp::detail::guarded([&]() -> gcomp_status {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) {
      return set_last_error(GCOMP_ERR_INVALID_ARGUMENT,
                            std::string(name) + "cannot make '" + dir + "': " + ec.message());
    }
    gloo::rendezvous::FileStore store(dir);
    gcomp::GlooOptions o;
    if (prefix) o.prefix = prefix;
    auto h = std::make_unique<gcomp_comm_s>();
    h->comm = std::make_unique<gcomp::Communicator>(store, rank, size, o);
    *out = h.release();
    return GCOMP_OK;
  });
#else
  (void)prefix, (void)rank, (void)size;
  return set_last_error(GCOMP_ERR_INVALID_ARGUMENT,
                        std::string(name) + "this build of gcomp has no Gloo transport");
#endif
}

const char* gcomp_comm_transport(gcomp_comm comm) {
  return comm ? gcomp::transport_name(comm->comm->transport()) : nullptr;
}
int gcomp_comm_rank(gcomp_comm comm) { return comm ? comm->comm->rank() : -1; }
int gcomp_comm_size(gcomp_comm comm) { return comm ? comm->comm->size() : -1; }

gcomp_status gcomp_comm_allreduce(gcomp_comm comm, const float* sendbuf, float* recvbuf,
                                  size_t count, gcomp_codec codec, gcomp_ef ef, uint64_t seed) {
  last_stats = gcomp_stats{};
  if (!comm) {
    return gcomp::detail::set_last_error(GCOMP_ERR_INVALID_ARGUMENT,
                                         "gcomp_comm_allreduce: comm is NULL");
  }
  return gcomp::detail::guarded([&]() -> gcomp_status {
    return allreduce_on(*comm->comm, "gcomp_comm_allreduce", sendbuf, recvbuf, count, codec, ef,
                        seed);
  });
}

void gcomp_comm_destroy(gcomp_comm comm) { delete comm; }

gcomp_status gcomp_last_stats(gcomp_stats* out) {
  if (!out)
    return gcomp::detail::set_last_error(GCOMP_ERR_INVALID_ARGUMENT,
                                         "gcomp_last_stats: out is NULL");
  *out = last_stats;
  return GCOMP_OK;
}

}  // extern "C"
