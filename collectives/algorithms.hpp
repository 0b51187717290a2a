// The allreduce algorithms, one file each, behind one shape: a Job describes the call after the
// ranks have agreed on it (same codec, size, options, algorithm, and no rank failed). An
// algorithm may still meet a failure that only one rank sees (the owner's re-encode of a reduced
// chunk that overflowed); it then sends an empty payload where its data would be, so that every
// rank learns of it in the same step and throws, instead of waiting for data that never comes.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "gcomp/codec.hpp"
#include "parallel.hpp"
#include "gcomp/communicator.hpp"
#include "mpi_util.hpp"

namespace gcomp::detail {

class DeviceBackend;
struct SparseRegions;

// Device memory a Communicator keeps for device tensors (payload staging), grown as needed.
struct DeviceStage {
  const DeviceBackend* dev = nullptr;
  void* buf[2] = {nullptr, nullptr};
  std::size_t bytes[2] = {0, 0};
  void* host = nullptr;  // pinned
  std::size_t host_bytes = 0;
  void* get(int slot, std::size_t need);
  void* get_host(std::size_t need);
  DeviceStage() = default;
  DeviceStage(const DeviceStage&) = delete;
  DeviceStage& operator=(const DeviceStage&) = delete;
  ~DeviceStage();
};

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
  bool out_ready = false;       // out already holds x (+ e), checked finite (device staging)
  // x + e, formed and checked before the agreement for the uncompressed path, in the scratch
  // vector run_dense sends from (scratch_vector<float, 101>): the caller's out stays untouched
  // until the exchange.
  bool sum_ready = false;
  // The whole-tensor payload, when it was made before the agreement (sparse codecs). Buffers
  // are thread-local and reused: fresh ones would cost a page fault per 4 KiB on every call.
  std::vector<std::byte>& payload = scratch_vector<std::byte, 100>();
  bool have_payload = false;
  // Agreed: the most entries any rank's sparse payload holds (or the codec's k, where the
  // payloads were not made before the agreement).
  std::uint64_t agreed_sent = 0;
  // sparse_reduce_scatter's memory of this tensor (agreed equal on every rank), or null.
  SparseRegions* regions = nullptr;

  Traffic traffic;
  double encode_seconds = 0;
  double decode_seconds = 0;

  // Device tensors: the codec runs on the device; payloads go through host memory to MPI.
  // Null dev for host tensors. in/out above are then host staging (n floats).
  const DeviceBackend* dev = nullptr;
  void* stream = nullptr;
  const float* d_in = nullptr;
  float* d_out = nullptr;
  const float* d_e_old = nullptr;  // with error feedback
  float* d_e_new = nullptr;
  DeviceStage* stage = nullptr;
};

// The whole-tensor encoding of job.in (with error feedback when job.ef), made once; on the
// device for device tensors.
void encode_whole(Job& job);

// out *= 1 / size when averaging.
void finish_average(Job& job);
// What write_out scales by to average in the same pass: 1 / size when averaging, else 1.
float average_scale(const Job& job);

// Device tensors: the whole-tensor payload encoded on the device into job.payload (host), and
// the algorithms' device forms (device.cpp).
void device_encode_whole(Job& job);
void run_device(Job& job, Algorithm algorithm);

// The even split of n elements into p chunks that every algorithm cutting a tensor uses: chunk
// j is [chunk_bound(n, j, p), chunk_bound(n, j + 1, p)).
inline std::uint64_t chunk_bound(std::uint64_t n, std::uint64_t j, std::uint64_t p) {
  return static_cast<std::uint64_t>((static_cast<unsigned __int128>(n) * j) / p);
}
// All p + 1 of them.
std::vector<std::uint64_t> even_bounds(std::uint64_t n, std::uint64_t p);

// compressed_reduce_scatter's owner step, shared by the host and device forms: sums the P
// payloads of this rank's chunk (len elements), averages if asked, re-encodes with the owner's
// memory; mine is left empty when the re-encode fails (the failure marker).
void crs_owner_step(Job& job, const std::vector<std::vector<std::byte>>& from, std::uint64_t len,
                    std::vector<std::byte>& mine, std::vector<float>& owner_next);
// Steps 2-4 after the chunks are encoded into `to`: the all-to-all, the owner step and the
// allgatherv of the owners' payloads into `all` (checked for failure markers).
void crs_exchange(Job& job, const std::vector<std::uint64_t>& bound,
                  const std::vector<std::vector<std::byte>>& to, Gathered& all,
                  std::vector<float>& owner_next);

// The device forms (device.cpp); allgather's runs majority_vote on the host.
void run_dense_device(Job& job);
void run_allgather_device(Job& job);
void run_crs_device(Job& job);

// The host form of dense, which the device form runs on its staging. The other algorithms' run
// functions are their files' own, reached through their rows (algorithm_table.hpp).
void run_dense(Job& job);

// The sparse stream of this rank's payload (sparse codecs).
struct SparseVector;
void payload_stream(Job& job, SparseVector& out);
// Whether the sparse algorithms' sparse vectors carry binary16 values (the codec's values=fp16).
bool half_values(const Job& job);

// The region exchange both region algorithms start with (sparse_split, sparse_reduce_scatter):
// this rank's payload as a stream (into mine), its part j, [bound[j], bound[j+1]), to rank j (an
// all-to-all), and the P parts of this rank's own region summed into acc in rank order. each(got)
// sees every rank's part before it is merged (nullptr: none). Slicing and merging count as
// decode time.
void reduce_own_region(Job& job, std::span<const std::uint64_t> bound, SparseVector& mine, SparseVector& acc,
                       const std::function<void(const SparseVector&)>& each);

}  // namespace gcomp::detail
