/* gcomp's compressed allreduce for C (library gcomp_mpi): like MPI_Allreduce of floats with
 * MPI_SUM, but each rank's contribution goes through a codec, and the algorithm that keeps the
 * payloads sparse or compressed on the wire is chosen by a cost model (or by the environment
 * variable GCOMP_ALGORITHM: dense, sparse_allgather, sparse_recursive_doubling, sparse_split,
 * allgather, compressed_reduce_scatter, sparse_reduce_scatter, low_rank).
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

gcomp_status gcomp_last_stats(gcomp_stats* out); /* of this thread's last gcomp_allreduce or
                                                    gcomp_allreduce_buckets_shaped */

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* GCOMP_GCOMP_MPI_H */
