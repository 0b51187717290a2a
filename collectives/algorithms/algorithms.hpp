// The allreduce algorithms, one file each, behind one shape: a Job describes the call after the
// ranks have agreed on it (same codec, size, options, algorithm, and no rank failed). An
// algorithm may still meet a failure that only one rank sees (the owner's re-encode of a reduced
// chunk that overflowed); it then sends an empty payload where its data would be, so that every
// rank learns of it in the same step and throws, instead of waiting for data that never comes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <variant>
#include <vector>

#include "gcomp/codec.hpp"
#include "gcomp/collective_types.hpp"
#include "gcomp/cost_model.hpp"
#include "gcomp/timeline.hpp"
#include "transport.hpp"
#include "workspace.hpp"

namespace gcomp::detail {

class DeviceBackend;
struct TensorState;

// Device memory a Communicator keeps for device tensors (payload staging), grown as needed.
struct DeviceStage {
  // The buffers, by what they hold: a call's payloads, the gathered payloads, low_rank's
  // factors (kFactorA: P, kFactorB: Q), allreduce_buckets' fused bucket and its small tensors.
  enum Slot : int { kPayload = 0, kGathered = 1, kFactorA = 2, kFactorB = 3, kFused = 4, kSlots };
  const DeviceBackend* dev = nullptr;
  void* buf[kSlots] = {};
  std::size_t bytes[kSlots] = {};
  void* host = nullptr;  // pinned
  std::size_t host_bytes = 0;
  void* get(int slot, std::size_t need);
  void* get_host(std::size_t need);
  DeviceStage() = default;
  DeviceStage(const DeviceStage&) = delete;
  DeviceStage& operator=(const DeviceStage&) = delete;
  ~DeviceStage();
};

// What the call is, fixed once every rank has agreed on it (same codec, size, options and
// algorithm, and no rank failed).
struct CallSpec {
  Net* net = nullptr;  // the Communicator's transport (transport.hpp)
  int rank = 0;
  int size = 1;
  const Codec* codec = nullptr;
  std::uint64_t seed = 0;         // this rank's seed for the codec (rank mixed in where it should)
  std::uint64_t owner_seed = 0;   // for re-encoding a reduced chunk
  std::uint64_t shared_seed = 0;  // the same on every rank (powersgd's random start of Q)
  bool average = false;
  bool majority_vote = false;
  // The call's tensors as matrices, in order and covering it (empty: none given).
  std::span<const MatrixShape> shapes;
};

// The call's memory. Host tensors: in and out. Device tensors (dev set): the codec runs on the
// device and payloads go through host memory to MPI; in and out are then host staging (n floats).
struct CallBuffers {
  std::span<const float> in;  // may alias out
  std::span<float> out;
  ErrorFeedback* ef = nullptr;  // this rank's memory, or null
  std::span<float> ef_next;     // where the new residual goes (committed by the caller)
  const DeviceBackend* dev = nullptr;
  void* stream = nullptr;
  const float* d_in = nullptr;
  float* d_out = nullptr;
  const float* d_e_old = nullptr;  // with error feedback
  float* d_e_new = nullptr;
  DeviceStage* stage = nullptr;
};

// The input as the steps before the algorithm left it, read where it is needed: one of
namespace prepared {
struct Checked {};  // x (+ e) checked finite where it is; nothing formed yet
struct Summed {     // x + e formed and checked (in the workspace): the uncompressed path sends it
  std::span<const float> values;
};
struct Staged {};  // device tensors: out (the host staging) holds x (+ e); reduced in place
struct Encoded {   // the whole-tensor payload (in the workspace), made once
  std::span<const std::byte> payload;
};
}  // namespace prepared
using Prepared =
    std::variant<prepared::Checked, prepared::Summed, prepared::Staged, prepared::Encoded>;

// Where a call's time and bytes go. A phase's seconds, from its start to the end of its scope,
// are added to its counter (also when it ends by an exception).
class Meter {
 public:
  Traffic traffic;            // in MPI calls (mpi_util.hpp adds to it)
  double encode_seconds = 0;  // the codec's encodes, x + e formed
  double decode_seconds = 0;  // decodes and the sparse algorithms' slicing, merging, selection

  // A timed part of the call: its seconds added to `into` and, with a timeline on, a span
  // named `name` (gcomp/timeline.hpp).
  class Phase {
   public:
    Phase(double& into, const char* name) : into_(into), name_(name), start_(now()) {}
    ~Phase() {
      const double end = now();
      into_ += end - start_;
      if (timeline::on()) {
        try {
          timeline::span(name_, name_, start_, end);
        } catch (...) {  // a span lost rather than a destructor that throws
        }
      }
    }
    Phase(const Phase&) = delete;
    Phase& operator=(const Phase&) = delete;

   private:
    double& into_;
    const char* name_;
    double start_;
  };
  [[nodiscard]] Phase encoding() { return Phase(encode_seconds, "encode"); }
  [[nodiscard]] Phase decoding() { return Phase(decode_seconds, "decode"); }
  [[nodiscard]] Phase communicating() { return Phase(traffic.seconds, "wire"); }  // MPI directly
};

struct Job {
  Job(const CallSpec& spec, const CallBuffers& buffers, Workspace& workspace)
      : call(spec), buf(buffers), ws(workspace) {}
  const CallSpec call;
  CallBuffers buf;
  Workspace& ws;  // the Communicator's scratch (workspace.hpp)
  Prepared input = prepared::Checked{};
  // Agreed before the run: auto found compression not worth it (x + e goes as it is), and the
  // most entries any rank's sparse payload holds (or the codec's k, where the payloads were not
  // made before the agreement).
  bool skip_codec = false;
  std::uint64_t agreed_sent = 0;
  // The running algorithm's state of this tensor (its row's make_state; agreed equal on
  // every rank), or null.
  TensorState* state = nullptr;
  // Agreed: the ranks' states in their ErrorFeedback slots differ (low_rank: one was reset), so
  // every rank starts from none.
  bool fresh_state = false;
  Meter meter;
};

// The whole-tensor encoding of the input (with error feedback when buf.ef), made once (into
// the workspace; on the device for device tensors); returns it.
std::span<const std::byte> encode_whole(Job& job);
// The payload encode_whole made (job.input holds prepared::Encoded).
inline std::span<const std::byte> payload_of(const Job& job) {
  return std::get<prepared::Encoded>(job.input).payload;
}

// out *= 1 / size when averaging.
void finish_average(Job& job);
// What write_out scales by to average in the same pass: 1 / size when averaging, else 1.
float average_scale(const Job& job);

// Device tensors: the whole-tensor payload encoded on the device into the workspace's payload
// (host), and the algorithms' device forms (device.cpp).
std::span<const std::byte> device_encode_whole(Job& job);
void run_device(Job& job, Algorithm algorithm);

// The even split of n elements into p chunks that every algorithm cutting a tensor uses: chunk
// j is [chunk_bound(n, j, p), chunk_bound(n, j + 1, p)).
inline std::uint64_t chunk_bound(std::uint64_t n, std::uint64_t j, std::uint64_t p) {
  return static_cast<std::uint64_t>((static_cast<unsigned __int128>(n) * j) / p);
}
// All p + 1 of them.
std::vector<std::uint64_t> even_bounds(std::uint64_t n, std::uint64_t p);

// compressed_reduce_scatter's steps shared by the host and device forms: the per-owner chunks
// this rank sends (its workspace buffers, filled by the caller: chunk c for rank c); then the
// all-to-all, the owner step (sums the P payloads of this rank's chunk, averages if asked,
// re-encodes with the owner's residual, an empty payload marking a failure) and the allgatherv of
// the owners' payloads (checked for failure markers), returned; and after the decode, the
// owner's new residual committed into the ErrorFeedback's slot.
std::vector<std::vector<std::byte>>& crs_outgoing(Job& job);
const Gathered& crs_exchange(Job& job, const std::vector<std::uint64_t>& bound);
void crs_commit(Job& job);

// Device tensors: x (+ e with error feedback) copied to host memory (host: n floats).
void device_input_to_host(Job& job, std::span<float> host);

// The device forms (device.cpp); allgather's runs majority_vote on the host.
void run_dense_device(Job& job);
void run_allgather_device(Job& job);
void run_crs_device(Job& job);

// The host form of dense, which the device form runs on its staging. The other algorithms' run
// functions are their files' own, reached through their rows (algorithm_table.hpp).
void run_dense(Job& job);

// This rank's payload as a sparse vector (sparse codecs).
struct SparseVector;
void payload_vector(Job& job, SparseVector& out);
// Whether the sparse algorithms' vectors carry binary16 values (the codec's values=fp16).
bool half_values(const Job& job);

// The region exchange both region algorithms start with (sparse_split, sparse_reduce_scatter):
// this rank's payload as a sparse vector (into mine), its part j, [bound[j], bound[j+1]), to rank j
// (an all-to-all), and the P parts of this rank's own region summed into acc in rank order.
// each(got) sees every rank's part before it is merged (nullptr: none). Slicing and merging count
// as decode time.
void reduce_own_region(Job& job, std::span<const std::uint64_t> bound, SparseVector& mine,
                       SparseVector& acc, const std::function<void(const SparseVector&)>& each);

}  // namespace gcomp::detail
