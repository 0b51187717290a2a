/* gcomp's compressed allreduce for C (library gcomp_mpi): like MPI_Allreduce of floats with
 * MPI_SUM, but each rank's contribution goes through a codec, and the algorithm that keeps the
 * payloads sparse or compressed on the wire is chosen by a cost model (or by the environment
 * variable GCOMP_ALGORITHM: an algorithm's name, as docs/algorithms.md lists them, or
 * fewest_bytes, the algorithm that sends the codec's bytes and the fewest of them by the byte
 * models, for links that are metered rather than slow; an unknown one's error names them all).
 *
 * The first call on a communicator is collective setup too: gcomp duplicates the communicator
 * (attached to it as an attribute, freed with it) and measures the network once.
 *
 * Collective rules: all ranks pass the same count, codec spec and seed. A rank whose arguments
 * are wrong or whose input holds NaN/Inf returns its own status; every other rank returns
 * GCOMP_ERR_MISMATCH (as they do when the ranks disagree), never waits. gcomp_last_error() says
 * which rank failed and why.
 *
 * A rank that does not come: a rank that has waited GCOMP_STALL_SECONDS (default 60; 0: never)
 * at the start of a call for the others prints once, to stderr, which call it waits at and which
 * ranks are not there. With GCOMP_TIMEOUT_SECONDS set (default 0: never), such a call returns
 * GCOMP_ERR_TIMEOUT on every rank instead of waiting on (the late rank too, when it comes:
 * after the timeout it waits at most as long again); the communicator's gcomp state can make no
 * more calls then (MPI cannot cancel the posted collective: each later call returns
 * GCOMP_ERR_TIMEOUT), so the program should end. Both are read when a communicator is first used;
 * a malformed value fails that call with GCOMP_ERR_INVALID_ARGUMENT. Only the wait for every rank
 * to come is watched: once all have come, a rank that dies inside the call is MPI's to report.
 */
#ifndef GCOMP_GCOMP_MPI_H
#define GCOMP_GCOMP_MPI_H

#include <mpi.h>

#include "gcomp/gcomp.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  uint64_t bytes_sent, bytes_received; /* this rank, this call */
  double encode_seconds, comm_seconds, decode_seconds;
  char algorithm[32]; /* e.g. "sparse_recursive_doubling" */
} gcomp_stats;

/* recvbuf = sum over ranks of decode(encode(sendbuf + residual)); sendbuf may equal recvbuf;
   ef may be NULL (no error feedback); every rank passes the same seed (the rank is mixed in). */
gcomp_status gcomp_allreduce(const float* sendbuf, float* recvbuf, size_t count, gcomp_codec codec,
                             gcomp_ef ef, uint64_t seed, MPI_Comm comm);

/* Many tensors in place, fused into buckets, each with its shape as a matrix: tensors[t] holds
   rows[t] x cols[t] floats (row-major: rows = the first dimension, cols = the product of the
   others; a 1-D tensor is n x 1). efs is NULL or holds ntensors memories (NULL entries: no error
   feedback for that tensor), each of its tensor's size. The low-rank codec (powersgd) needs this
   form; the others ignore the shapes. Tensors under 1024 elements are summed uncompressed, in 25
   MiB buckets otherwise (Communicator::allreduce_buckets with shapes). gcomp_last_stats sums
   the buckets. */
gcomp_status gcomp_allreduce_buckets_shaped(float* const* tensors, const size_t* rows,
                                            const size_t* cols, size_t ntensors, gcomp_codec codec,
                                            const gcomp_ef* efs, uint64_t seed, MPI_Comm comm);

gcomp_status gcomp_last_stats(gcomp_stats* out); /* of this thread's last gcomp_allreduce,
                                                    gcomp_allreduce_buckets_shaped or
                                                    gcomp_comm_allreduce */

/* A communicator of gcomp's own, on either transport: MPI, or Gloo for processes that no MPI
   launcher started (they meet through a file store in a directory every one of them sees). The
   calls above take an MPI_Comm and keep gcomp's state in it; these take the handle. */
typedef struct gcomp_comm_s* gcomp_comm;

/* Collective over comm: gcomp's communicator of an MPI communicator (duplicated, and the network
   measured). *out is set on success. */
gcomp_status gcomp_comm_create_mpi(MPI_Comm comm, gcomp_comm* out);

/* Collective over the `size` processes that call it with the same dir and prefix, each with its
   own rank in [0, size): gcomp's communicator on Gloo over TCP, met through Gloo's file store in
   dir (made if missing; on a shared file system for processes on several hosts). prefix NULL:
   "gcomp"; each communicator made in one dir needs a prefix of its own. MPI need not be
   initialized. GLOO_SOCKET_IFNAME names the network interface where the host's name does not
   resolve to the right one. GCOMP_ERR_INVALID_ARGUMENT for a bad rank, size, dir or prefix, or a
   build without Gloo; GCOMP_ERR_TRANSPORT when the others do not come within 300 s or a
   connection fails. *out is set on success. */
gcomp_status gcomp_comm_create_gloo(const char* dir, const char* prefix, int rank, int size,
                                    gcomp_comm* out);

/* "mpi" or "gloo"; NULL for a NULL handle. */
const char* gcomp_comm_transport(gcomp_comm comm);
/* This process's rank and the number of ranks; -1 for a NULL handle. */
int gcomp_comm_rank(gcomp_comm comm);
int gcomp_comm_size(gcomp_comm comm);

/* gcomp_allreduce on comm: the same contract (collective; a rank's bad argument makes every rank
   return an error, never wait). */
gcomp_status gcomp_comm_allreduce(gcomp_comm comm, const float* sendbuf, float* recvbuf,
                                  size_t count, gcomp_codec codec, gcomp_ef ef, uint64_t seed);

/* Frees the communicator (NULL: nothing). On MPI collective over its ranks (MPI_Comm_free of the
   duplicate); on Gloo its connections close. */
void gcomp_comm_destroy(gcomp_comm comm);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* GCOMP_GCOMP_MPI_H */
