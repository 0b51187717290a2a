// The allreduce algorithms, one file each, behind one shape: a Job describes the call after the
// ranks have agreed on it (same codec, size, options, algorithm, and no rank failed). An
// algorithm may still meet a failure that only one rank sees (the owner's re-encode of a reduced
// chunk that overflowed); it then sends an empty payload where its data would be, so that every
// rank learns of it in the same step and throws, instead of waiting for data that never comes.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "gcomp/codec.hpp"
#include "parallel.hpp"
#include "gcomp/communicator.hpp"
#include "mpi_util.hpp"

namespace gcomp::detail {

struct Job {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  const Codec* codec = nullptr;
  std::span<const float> in;  // may alias out
  std::span<float> out;
  ErrorFeedback* ef = nullptr;  // this rank's memory, or null
  std::span<float> ef_next;     // where the new residual goes (committed by the caller)
  std::uint64_t seed = 0;       // this rank's seed for the codec (rank mixed in where it should)
  std::uint64_t owner_seed = 0; // for re-encoding a reduced chunk
  bool average = false;
  bool majority_vote = false;
  bool skip_codec = false;      // auto found compression not worth it: send x + e as it is
  bool out_ready = false;       // out already holds x (+ e), checked finite
  // The whole-tensor payload, when it was made before the agreement (sparse codecs). Buffers
  // are thread-local and reused: fresh ones would cost a page fault per 4 KiB on every call.
  std::vector<std::byte>& payload = scratch_vector<std::byte, 100>();
  bool have_payload = false;

  Traffic traffic;
  double encode_seconds = 0;
  double decode_seconds = 0;
};

// The whole-tensor encoding of job.in (with error feedback when job.ef), made once.
void encode_whole(Job& job);

// out *= 1 / size when averaging.
void finish_average(Job& job);

void run_dense(Job& job);
void run_sparse_allgather(Job& job);
void run_sparse_recursive_doubling(Job& job);
void run_sparse_split(Job& job);
void run_allgather(Job& job);
void run_compressed_reduce_scatter(Job& job);

// The sparse stream of this rank's payload (sparse codecs).
struct Stream;
void payload_stream(Job& job, Stream& out);

}  // namespace gcomp::detail
