// gcomp's collectives (library gcomp_mpi): a Communicator that allreduces float tensors through
// any codec, keeping the payloads sparse or compressed on the wire, and picks the algorithm from a
// cost model unless told which one to use. It runs on a transport: MPI (a communicator of an MPI
// program) or Gloo (processes that meet through a key-value store: a file store on a shared file
// system, or torch.distributed's store under gcomp.torch), with the same methods and results.
//
// Semantics: on every rank the result is the sum (or, with `average`, the mean) over ranks of
// what each rank's codec sent, decode(encode(x_r + e_r)); compressed_reduce_scatter adds one more
// encode of each reduced chunk (see docs/algorithms.md). Every rank ends with the same bits.
//
// Collective rules: every call is collective over the communicator; all ranks pass the same codec
// spec, element count, options and seed. Ranks that disagree, or a rank whose own part fails
// (NaN/Inf input, bad arguments), never hang the others: every rank throws gcomp::Error, the
// failing rank with its own status, the others with Status::mismatch naming the rank and reason.
// Finite inputs whose sum overflows float32 make every rank throw Error(Status::nonfinite), with
// every algorithm. Errors from MPI itself become Error(Status::mpi).
//
// After a failure the error-feedback residual is as it was before the call. So are the output
// and (in place) the input when the failure is found before the exchange: bad arguments, NaN/Inf
// in x or x + e, ranks that disagree, another rank's such failure. A failure during the exchange
// (the sum overflowing, an MPI error) leaves the output's contents unspecified (in place: the
// input is lost). allreduce_buckets runs its buckets in turn: those before a failing one are
// complete, their tensors reduced and their residuals committed.
//
// Threads: a Communicator is used by one thread at a time (MPI_THREAD_FUNNELED is enough).
// Errors of the transport itself become Error(Status::mpi) on MPI and Error(Status::transport)
// on Gloo (a connection closed: a process gone, or one that timed out and gave up).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gcomp/codec.hpp"
#include "gcomp/collective_types.hpp"

namespace gloo::rendezvous {
class Store;  // gloo/rendezvous/store.h: the key-value store Gloo's processes meet through
}

namespace gcomp {

// This rank's measurement of the network among comm's ranks (collective; docs/algorithms.md,
// "The network"): alpha from a ping-pong between pairs of ranks, each pair on two hosts where
// comm spans several; beta with every rank sending to the next at once; beta_one with one flow
// alone; beta_all from an all-to-all; beta_allreduce fitted to MPI's allreduce. A Communicator
// measures it when made and agrees the ranks' numbers by MAX.
NetworkModel measure_network(MPI_Comm comm);

class Communicator {
 public:
  // Collective over comm: duplicates it (errors return, never abort) and measures the network
  // (a ping-pong for alpha, all ranks exchanging at once for beta; agreed by MAX over ranks).
  explicit Communicator(MPI_Comm comm);
  // The same with a given network model instead of a measurement, and optionally a given source
  // of the other measurements (null: the default Timing, which measures).
  Communicator(MPI_Comm comm, const NetworkModel& network,
               std::shared_ptr<Timing> timing = nullptr);
  // On Gloo: collective over the `size` processes that make it with the same store and
  // options.prefix, each with its own rank in [0, size). They meet through the store (each
  // publishes its address under the prefix; gloo::rendezvous::FileStore on a directory every
  // host sees, or any other Store), connect to one another over TCP, and the network is measured
  // as above. Needs no MPI (MPI need not be initialized). The store is used only while the
  // constructor runs. Errors: Error(invalid_argument) for a bad rank, size or option, or in a
  // build without Gloo (have_gloo()); Error(transport) when the rendezvous or a connection fails
  // or takes longer than options.connect_seconds.
  Communicator(gloo::rendezvous::Store& store, int rank, int size, const GlooOptions& options = {});
  Communicator(gloo::rendezvous::Store& store, int rank, int size, const NetworkModel& network,
               std::shared_ptr<Timing> timing = nullptr, const GlooOptions& options = {});
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const noexcept;
  int size() const noexcept;
  Transport transport() const noexcept;
  // The duplicated MPI communicator; MPI_COMM_NULL on Gloo.
  MPI_Comm comm() const noexcept;
  const NetworkModel& network() const noexcept;
  // The network inside a host, measured when it was made where the ranks span several hosts
  // and some host has several (hosts()); zeros otherwise (the cost model then takes network()
  // for both levels). alpha and the betas only (beta_allreduce 0).
  const NetworkModel& host_network() const noexcept;

  // out = sum over ranks of decode(encode(in + e)); in and out may be the same memory. A
  // low-rank codec (powersgd) needs shapes: every rank throws Error(invalid_argument) naming
  // allreduce_buckets with shapes.
  // ef (may be null) is this rank's error-feedback memory for the tensor. Seeds: the codec's
  // draws use derive_seed(seed, tensor, 0, rank), except random-k's index draw, which leaves the
  // rank out so that every rank selects the same indices (their sum stays k-sparse).
  void allreduce(std::span<const float> in, std::span<float> out, const Codec& codec,
                 ErrorFeedback* ef = nullptr, const AllreduceOptions& options = {});
  void allreduce(std::span<float> inout, const Codec& codec, ErrorFeedback* ef = nullptr,
                 const AllreduceOptions& options = {}) {
    allreduce(inout, inout, codec, ef, options);
  }

  // The same for tensors in device memory (gcomp::cuda::view, library gcomp_cuda; both on one
  // stream), with ef null or in device memory (gcomp::cuda::error_feedback). The codec runs on the
  // device and only payloads cross to the host for MPI (MPICH is not CUDA-aware here); results are
  // the host path's bit for bit, and ranks may mix host and device tensors. Host views take the
  // host path. See collectives/algorithms/device.cpp for what runs where.
  void allreduce(TensorView<const float> in, TensorView<float> out, const Codec& codec,
                 ErrorFeedback* ef = nullptr, const AllreduceOptions& options = {});
  void allreduce(TensorView<float> inout, const Codec& codec, ErrorFeedback* ef = nullptr,
                 const AllreduceOptions& options = {}) {
    allreduce(TensorView<const float>(inout), inout, codec, ef, options);
  }

  // Allreduces many tensors in place, fused into buckets; efs is empty (no error feedback) or
  // holds one memory per tensor (null entries allowed). Tensors with fewer than dense_below
  // elements are summed uncompressed. Stats: last_stats() sums the call's buckets.
  void allreduce_buckets(std::span<const std::span<float>> tensors, const Codec& codec,
                         std::span<ErrorFeedback* const> efs = {},
                         const BucketOptions& options = {});
  // The same with each tensor's shape (shapes[t].rows * shapes[t].cols == tensors[t].size(),
  // else every rank throws Error(invalid_argument) or Error(mismatch)), which a low-rank codec
  // (powersgd, CodecProperties::low_rank) needs and the other codecs ignore. powersgd runs the
  // low_rank algorithm on each bucket (docs/algorithms.md): the matrices it compresses go as
  // their factors, 1-D tensors and matrices below its min_compression_rate dense in the same
  // collective. Its state (the residual, and Q or P per matrix for warm start and alternating)
  // lives in each tensor's ErrorFeedback; a tensor without one keeps nothing (a random Q every
  // step, no residual, and with start = s it stays dense). The shapes and the states' bits are
  // part of what ranks agree on: ranks whose states differ (one was reset) all start afresh.
  void allreduce_buckets(std::span<const std::span<float>> tensors,
                         std::span<const MatrixShape> shapes, const Codec& codec,
                         std::span<ErrorFeedback* const> efs = {},
                         const BucketOptions& options = {});
  // The same two on views (tensor.hpp): all host views (the forms above), or all in one device
  // memory on one stream (gcomp::cuda::view), with efs null or in that device memory
  // (gcomp::cuda::error_feedback). Each bucket is fused on the device and runs as allreduce's
  // device form: the codec on the device, only payloads crossing to the host for MPI; powersgd
  // forms M = x + e, its products (cuBLAS) and the reconstruction on the device, and only the
  // factors and the dense tensors' values cross (collectives/algorithms/low_rank.cpp). Results are the host
  // path's bit for bit (powersgd: every rank's out is the same bits whichever memory it runs in;
  // a GPU's products may differ from the CPU's within the bound cuda/low_rank.cu states). Host
  // and device views mixed in one call, two streams or backends, or memories in the other
  // memory: every rank throws Error(invalid_argument).
  void allreduce_buckets(std::span<const TensorView<float>> tensors, const Codec& codec,
                         std::span<ErrorFeedback* const> efs = {},
                         const BucketOptions& options = {});
  void allreduce_buckets(std::span<const TensorView<float>> tensors,
                         std::span<const MatrixShape> shapes, const Codec& codec,
                         std::span<ErrorFeedback* const> efs = {},
                         const BucketOptions& options = {});

  // Takes this rank's part in an allreduce it cannot make (its input is missing, its own step
  // failed): the other ranks' matching call throws Error(mismatch) naming this rank and reason
  // instead of waiting. Returns once they have been told.
  void abandon(Status reason, const std::string& why);

  // What the next auto call for this codec and size would do (see docs/algorithms.md, "Learning
  // from its own calls": the model's choice first, then each plausible candidate measured, then
  // the fastest measured), and the
  // model's time for each algorithm applying the codec (infinity where it does not apply) and
  // for the uncompressed allreduce, for a codec on n elements whose payloads hold `sent` entries
  // per rank (sparse codecs; 0: the codec's k), with or without error feedback (which adds the
  // residual's pass to every compressing algorithm, and to sparse_reduce_scatter the return of
  // what was not kept). choose() is collective the first time for a
  // codec and size class (every rank measures the codec, the slowest speeds are agreed, as in
  // a call), so every rank gets the same answer; predict() uses this rank's own speeds.
  Choice choose(const Codec& codec, std::size_t n, std::size_t sent = 0,
                bool allow_uncompressed = true);
  std::array<double, kAlgorithmCount> predict(const Codec& codec, std::size_t n,
                                              std::size_t sent = 0, bool error_feedback = false);
  double predict_uncompressed(std::size_t n);

  const CallStats& last_stats() const noexcept;
  const TotalStats& total_stats() const noexcept;

  // A rank that does not come to a call. Every call starts with the agreement, which no rank
  // leaves until all have come; a rank that has waited there stall_seconds (default
  // GCOMP_STALL_SECONDS, else 60; 0: never) prints once, to stderr, which call it waits at (its
  // number, size, codec and label) and which ranks are not there, each with where it is: at
  // another call, or in none of this Communicator's (asked on a duplicate communicator of its
  // own). With timeout_seconds (default GCOMP_TIMEOUT_SECONDS, else 0: never) the call throws
  // Error(timeout) naming them instead of waiting on; the Communicator can then make no more
  // calls (its agreement stays posted in MPI, which cannot cancel a collective): every later
  // call throws Error(timeout), and the job should end (from a checkpoint, restart it). A rank
  // that skipped a call and came to the next meets the others' agreement of the skipped one;
  // where the two differ (size, seed, codec) every rank throws Error(mismatch), each naming its
  // own call. With a timeout set, each call's agreement is followed by a barrier (one more small
  // collective a call): a rank that comes after the others timed out completes their posted
  // agreement but never passes the barrier, which they never join, and throws Error(timeout)
  // there after timeout_seconds, instead of going on into exchanges nobody else makes. Waits
  // inside a call, once every rank has passed the agreement, are not limited. Negative or
  // non-finite seconds: Error(invalid_argument).
  void set_stall_seconds(double seconds);
  void set_timeout_seconds(double seconds);
  double stall_seconds() const noexcept;
  double timeout_seconds() const noexcept;
  // The calls this Communicator has made (each allreduce, each bucket of allreduce_buckets,
  // each abandon), as the stall report numbers them.
  std::uint64_t calls() const noexcept;

  // Every rank's host, as the transport tells them apart (MPI: ranks that share memory; Gloo:
  // GlooOptions::host): hosts()[r] is the lowest rank on rank r's host.
  const std::vector<int>& hosts() const noexcept;

 private:
  // Everything else (collectives/call/communicator_impl.hpp): the duplicated communicator, the agreed
  // network and speeds, auto's learner and calibrations, the algorithms' memories, the staging
  // for device tensors, the statistics.
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gcomp
