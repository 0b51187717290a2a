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

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gcomp/codec.hpp"

namespace gloo::rendezvous {
class Store;  // gloo/rendezvous/store.h: the key-value store Gloo's processes meet through
}

namespace gcomp {

// The engine under a Communicator's collectives (docs/algorithms.md, "Transports").
//   mpi   an MPI communicator (duplicated): MPI programs, mpiexec, the C API and the interposer
//   gloo  Gloo's TCP transport, its processes met through a key-value store: launchers that are
//         not mpiexec (torchrun, Slurm's srun, Kubernetes), under gcomp.torch on torch's store
enum class Transport : int { mpi = 0, gloo };
const char* transport_name(Transport t) noexcept;  // "mpi", "gloo"
// Whether this build has the Gloo transport (libgloo-dev found when it was configured).
bool have_gloo() noexcept;

// How a Communicator on Gloo connects (Communicator(store, rank, size, ...)).
struct GlooOptions {
  // The keys of the rendezvous live under this prefix in the store; each Communicator made on
  // one store needs a prefix of its own (the same on all its ranks).
  std::string prefix = "gcomp";
  // The network interface to listen and connect on (e.g. "eth0"). Empty: GLOO_SOCKET_IFNAME
  // (its first name), else the address of `hostname`.
  std::string interface;
  // Empty: the host's name, where it resolves to an address this process can bind, else
  // 127.0.0.1 (one host only).
  std::string hostname;
  // This process's host for the locality the cost model needs (which ranks share a host).
  // Empty: GCOMP_HOST, else the host's name and network namespace (namespaces on one machine,
  // as on the per-host testbed, are hosts of their own).
  std::string host;
  // Seconds the rendezvous and the connections may take (every rank must come within them).
  double connect_seconds = 300;
};

enum class Algorithm : int {
  // Not an algorithm but a rule, resolved on every call before anything runs: among the
  // algorithms auto weighs for the codec that send its bytes (dense only for `none`, whose bytes
  // are float32), the one whose byte model (predict_bytes) sends the fewest per rank, ties to
  // the lower value: for links that are metered rather than slow ("fewest_bytes";
  // fewest_bytes_algorithm in gcomp/cost_model.hpp).
  fewest_bytes = -1,
  automatic = 0,              // chosen by the cost model ("auto")
  dense,                      // MPI_Allreduce of float32 (each rank's decoded contribution)
  sparse_allgather,           // allgatherv of sparse payloads, decode_add each
  sparse_recursive_doubling,  // SparCML SSAR_Recursive_double
  sparse_split,               // SparCML SSAR/DSAR_Split_allgather
  allgather,                  // allgatherv of any codec's payloads, decode_add each
  compressed_reduce_scatter,  // encode chunks, all-to-all, reduce + re-encode, allgather
  sparse_reduce_scatter,      // regions all-to-all, owners keep a global top-k, allgather
  low_rank,                   // PowerSGD: the factors P = M Q and Q = M^T P allreduced per bucket
  two_level,                  // sum inside each host, compress only across hosts, gather back
  // A new algorithm goes here, last, and into kLastAlgorithm.
};
inline constexpr Algorithm kLastAlgorithm = Algorithm::two_level;
// The number of Algorithm values, automatic included.
inline constexpr int kAlgorithmCount = static_cast<int>(kLastAlgorithm) + 1;

// How every wait for MPI in this process completes (docs/algorithms.md, "Waiting"):
//   automatic  GCOMP_WAIT (auto, spin, yield or sleep) when set, else spin, or yield where a
//              Communicator found more ranks on its node than cores; decided when each
//              Communicator is made (an unknown GCOMP_WAIT makes that throw
//              Error(invalid_argument))
//   spin       MPI_Wait: MPI's own busy loop, the lowest latency, a core busy while waiting
//   yield      MPI_Test, and sched_yield between polls
//   sleep      MPI_Test, polling for the first 20 us, then sleeping between polls (10 us, doubling
//              to 100 us): for waits beside compute on the same cores (a training step's
//              communication thread), which a spinning wait slows; up to ~100 us later a wait
// On the Gloo transport the agreement's waits on its own sockets follow it too (spin: poll(2)
// without a timeout, yield: with sched_yield between polls, sleep: poll(2) blocking until a
// socket is ready); its waits for data block whatever it says.
// Applies from the next wait on, to every Communicator; thread-safe.
enum class WaitPolicy : int { automatic = 0, spin, yield, sleep };
void set_wait_policy(WaitPolicy policy) noexcept;
WaitPolicy wait_policy() noexcept;            // as set (automatic unless set)
WaitPolicy effective_wait_policy() noexcept;  // what waits do now: spin, yield or sleep
const char* wait_policy_name(WaitPolicy policy) noexcept;  // "auto", "spin", "yield", "sleep"
// Throws Error(invalid_argument) naming the text and the known names.
WaitPolicy parse_wait_policy(std::string_view name);

// "auto", "fewest_bytes", "dense", "sparse_allgather", ...
const char* algorithm_name(Algorithm a) noexcept;
// Throws Error(invalid_argument) naming the text and the known names.
Algorithm parse_algorithm(std::string_view name);

// The network as the cost model sees it: a message of m bytes between two ranks, while every
// rank of the communicator is sending one too, takes alpha + m * beta seconds. When every rank
// sends to every other at once (all-to-all) the bytes flow at beta_all instead (shared links and
// TCP incast make that slower), and a single message alone at beta_one (on a switched network
// about beta; on a shared one, such as an emulated loopback, about beta / P). 0 means "as beta".
//
// MPI's own allreduce is modelled with beta_allreduce, fitted to a timed 4 MiB MPI_Allreduce,
// since its internal copies and reductions (on shared memory they dominate) are MPI's business;
// on fast networks also with beta_allreduce_large, fitted to 32 MiB (beyond the caches), and
// between the two sizes the per-byte cost is interpolated in log size.
struct NetworkModel {
  double alpha = 0;                 // seconds
  double beta = 0;                  // seconds per byte, every rank sending to one other
  double beta_all = 0;              // seconds per byte, all-to-all
  double beta_one = 0;              // seconds per byte, one message alone
  double beta_allreduce = 0;        // seconds per byte of 2 (P-1)/P 4n in MPI's allreduce
  double beta_allreduce_large = 0;  // the same at 32 MiB; 0: as beta_allreduce
};

// Measured speeds of the local compute steps that the cost model needs.
struct ComputeModel {
  double encode = 0;  // seconds per element, this codec
  double decode = 0;  // seconds per element decode_add, this codec
  double reduce = 0;  // seconds per element of a float32 sum (MPI's reduction, dense merges)
  double merge = 0;   // seconds per entry of a sparse stream merge
};

struct AllreduceOptions {
  // automatic: the cost model decides by time, unless the environment variable GCOMP_ALGORITHM
  // names an algorithm (or fewest_bytes). fewest_bytes: the algorithm that applies the codec and
  // sends the fewest bytes, by the model, the same on every call of a (codec, size). Anything
  // else is used as given (and must suit the codec).
  Algorithm algorithm = Algorithm::automatic;
  bool average = false;        // divide the sum by the number of ranks
  bool majority_vote = false;  // sign codec, allgather: sum of scales * sign(sum of signs)
  std::uint64_t seed = 0;      // the same on every rank; the rank is mixed in (see below)
  std::uint64_t tensor = 0;    // mixed into the seed, so tensors of one step draw differently
  // automatic only: when no compressing algorithm is predicted (or was measured) to beat a
  // plain float32 allreduce, send x + e as it is: auto's `dense` is then MPI_Allreduce with
  // codec none (CallStats::compressed says false; the residual becomes zero), so compression
  // never makes a call slower. Set false when the result must always be the sum of what the codec
  // sent (accuracy experiments, and the C API, whose contract says so); auto may still choose
  // `dense`, which then sends each rank's decode as float32 (the codec's sum, not its bytes:
  // fewest_bytes sends the codec's bytes).
  bool allow_uncompressed = true;
  // The caller's name for the call ("bucket 3 of step 120"), said in a stall report or a
  // timeout's message (set_stall_seconds); not compared between ranks. Null: none.
  const char* label = nullptr;
};

// What auto decides: an algorithm, and whether the codec is applied at all.
struct Choice {
  Algorithm algorithm = Algorithm::dense;
  bool compressed = true;
};

// What one call did, and the running totals.
struct CallStats {
  std::uint64_t bytes_sent = 0;      // handed to MPI by this rank, counted per destination
  std::uint64_t bytes_received = 0;  // delivered to this rank by MPI
  double encode_seconds = 0;  // the codec's encodes (and x + e formed for an uncompressed call)
  double comm_seconds = 0;    // in MPI calls, including the agreement between ranks
  // Everything after the encode that is not MPI: the codec's decodes and, in the sparse
  // algorithms, slicing, merging and selecting sparse vectors (the name is the codecs').
  double decode_seconds = 0;
  double agree_seconds = 0;  // of comm_seconds, the agreement's (one small allreduce a call)
  Algorithm algorithm = Algorithm::dense;  // allreduce_buckets: the last bucket's
  bool compressed = true;   // false when auto skipped the codec (see allow_uncompressed)
  std::uint64_t calls = 0;  // collectives made: 1, or allreduce_buckets' buckets
  std::array<std::uint64_t, kAlgorithmCount> by_algorithm{};  // of those calls, per algorithm
  std::uint64_t compressed_calls = 0;  // of those calls, the ones that applied the codec (not
                                       // allreduce_buckets' dense bucket of small tensors)

  // Sums s into these (the calls of one allreduce_buckets): counts, bytes and seconds add,
  // algorithm becomes s's, compressed holds while every call compressed.
  void add(const CallStats& s) noexcept;
};
struct TotalStats {
  std::uint64_t calls = 0;
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
  double encode_seconds = 0;
  double comm_seconds = 0;
  double decode_seconds = 0;  // decodes, merges and selection (CallStats::decode_seconds)
  double agree_seconds = 0;
  std::array<std::uint64_t, kAlgorithmCount> by_algorithm{};  // calls per algorithm
  std::uint64_t compressed = 0;  // calls that applied the codec (see CallStats::compressed)

  // Counts one call's statistics in.
  void add(const CallStats& s) noexcept;
};

// A tensor's shape as a matrix, for the low-rank codecs (powersgd): rows = its first dimension,
// cols = the product of the others (a conv weight out x in*k*k, as torch's view(shape[0], -1));
// a 1-D tensor of n elements is n x 1. rows * cols is the tensor's element count.
struct MatrixShape {
  std::size_t rows = 0;
  std::size_t cols = 1;
};

// Fusing many tensors (a model's layers) into buckets, one collective per bucket.
struct BucketOptions {
  AllreduceOptions allreduce;
  std::size_t bucket_bytes = 25u << 20;  // float32 bytes per bucket
  std::size_t dense_below = 1024;        // tensors with fewer elements go dense, uncompressed
};

// Where the numbers that auto decides by come from (docs/algorithms.md, "Learning from its own
// calls"), apart from the network (measured at creation, or given). The default measures this
// machine: the cost model's measure_compute and measure_reduce_and_merge, and each call's cost
// (its thread's CPU time or its wall time, below). A test or a simulation derives its own, so that
// what auto chooses does not depend on the machine or its load. The Communicator agrees every
// number by MAX over ranks, so ranks may return different ones. Called from the thread that makes
// the call.
class Timing {
 public:
  virtual ~Timing() = default;
  // The codec's encode and decode speeds on about n elements (ComputeModel's encode, decode);
  // asked the first time a (spec, size class) meets auto, by all ranks at once.
  virtual ComputeModel codec_speeds(const Codec& codec, std::size_t n);
  // The same for a call on device tensors: `input` is the call's input, whose device and stream
  // the default times the codec's device kernels on (measure_compute(codec, n, input)), since a
  // GPU's codec is not the CPU's. Kept apart from codec_speeds' numbers, per (spec, size class).
  virtual ComputeModel device_codec_speeds(const Codec& codec, std::size_t n,
                                           TensorView<const float> input);
  // The codec-independent speeds (ComputeModel's reduce, merge); asked once, at creation.
  virtual ComputeModel shared_speeds();
  // The seconds auto learns for the call that just ran `ran` on n elements with this codec;
  // `seconds` is what the call cost this rank, measured (the default returns it): the calling
  // thread's CPU time (user and system) where the waits spin or yield (WaitPolicy), the tensors
  // are on the host and the library runs one thread (num_threads()); else its wall-clock time.
  // A spinning or yielding wait keeps its core unless another thread wants it, so where the cores
  // are free (a slow link) the CPU time is the wall time, and where training threads and ranks
  // share them it is what the call took from their work (docs/algorithms.md, "What a call costs").
  virtual double call_seconds(const Codec& codec, std::size_t n, Choice ran, double seconds);
};

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
  // host path. See collectives/device.cpp for what runs where.
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
  // factors and the dense tensors' values cross (collectives/low_rank.cpp). Results are the host
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
  // Everything else (collectives/communicator_impl.hpp): the duplicated communicator, the agreed
  // network and speeds, auto's learner and calibrations, the algorithms' memories, the staging
  // for device tensors, the statistics.
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gcomp
