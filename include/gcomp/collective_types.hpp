// The vocabulary of gcomp's collectives, without the engines: which transport and algorithm a
// call uses, its options, what it did (statistics), the network and compute models auto decides
// by, and the Timing it learns from. gcomp/communicator.hpp holds the Communicator that takes
// them; this header needs no MPI, so the layers under the call (collectives/algorithms/,
// collectives/planning/) and code that only names options include it alone.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gcomp/codec.hpp"

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
  // A new algorithm goes here, last, and into kLastAlgorithm (docs/algorithms.md, "Adding an
  // algorithm").
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
//              to 100 us; in a long wait up to an eighth of the time waited, at most 1 ms): for
//              waits beside compute on the same cores (a training step's communication
//              thread), which a spinning wait slows; a wait sees its completion up to ~100 us
//              late (in a long wait up to an eighth of it, at most 1 ms)
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

}  // namespace gcomp
