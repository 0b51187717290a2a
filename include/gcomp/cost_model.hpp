// The alpha-beta cost model behind Algorithm::automatic (docs/algorithms.md derives each
// formula). It predicts the seconds one allreduce takes with each algorithm from the network
// (alpha, beta), the codec's measured compute speeds, n, the number of ranks and the payload
// sizes; the library calls it with the values the ranks agreed on, and the benchmarks call it to
// extrapolate to 1024 ranks and 1/10/100 Gbit.
#pragma once

#include <array>
#include <cstddef>
#include <limits>
#include <span>

#include "gcomp/collective_types.hpp"

namespace gcomp {

struct ModelInput {
  double n = 0;                  // elements
  int ranks = 1;
  NetworkModel network;
  ComputeModel compute;          // decode: per element (dense codecs) or per entry (sparse)
  bool codec_none = false;       // the codec is `none` (and no error feedback)
  bool sparse = false;           // the codec sends (index, value) entries
  bool shared_support = false;   // every rank selects the same indices (random-k)
  double sent = 0;               // sparse: entries per rank (the largest rank's)
  double payload_bytes = 0;      // one rank's whole-tensor payload (the largest rank's)
  double value_bytes = 4;        // per value sent as such (CodecProperties::value_bytes): 4 or 2
  bool average = false;
  bool error_feedback = false;   // for the uncompressed path: forming x + e costs a pass
  bool allow_uncompressed = true;
  // For the algorithms whose model reads more than the sizes above: the codec (null: the sizes
  // only), and the call's tensors as matrices, in order (empty: the tensor as one square matrix).
  // A codec that factors matrices (CodecProperties::needs_shapes) has its algorithm's model from
  // these; compute.encode is then seconds per element and rank of one product, compute.decode of
  // the reconstruction.
  const Codec* codec = nullptr;
  std::span<const MatrixShape> shapes;
  // Where the ranks are, for two_level: `hosts` hosts (0 or 1: one, or not known; two_level
  // then does not apply), at most `ranks_per_host` ranks on one, and the network inside a host
  // (host_network; zeros: as `network`, which then stands for the network between hosts).
  int hosts = 0;
  int ranks_per_host = 1;
  NetworkModel host_network;
  // The steps inside a host go through memory the host's ranks share (two_level's, where they
  // can): passes over memory and two barriers instead of messages at host_network's beta.
  bool host_memory = false;
  // The model's own: MPI's allreduce in the formulas runs on two levels (two_level's form for
  // `none` and the low-rank codecs, whose one-level algorithms it runs on such an allreduce).
  bool two_level_allreduce = false;
};

inline constexpr double kNotApplicable = std::numeric_limits<double>::infinity();

// Predicted seconds per algorithm (index = Algorithm value); kNotApplicable where an algorithm
// does not apply to the codec, and for Algorithm::automatic.
std::array<double, kAlgorithmCount> predict(const ModelInput& in);

// Predicted bytes sent per rank by each algorithm (the largest rank's; the agreement aside);
// kNotApplicable where an algorithm does not apply.
std::array<double, kAlgorithmCount> predict_bytes(const ModelInput& in);

// A plain float32 allreduce of x (+ e), the codec skipped.
double predict_uncompressed(const ModelInput& in);

// The algorithms auto weighs for this codec, and the model's cheapest of them (what auto
// would run before it has measured anything; Communicator::choose says what it will run).
bool auto_candidate(Algorithm a, const ModelInput& in);
Algorithm cheapest(const ModelInput& in);

// What Algorithm::fewest_bytes runs: among the algorithms auto weighs for the codec
// (auto_candidate: no second compression of a sparse codec's sum by compressed_reduce_scatter,
// sparse_reduce_scatter only with error feedback) that send the codec's bytes (dense only for
// `none`: for another codec it sends each rank's decode as float32), the one with the fewest
// predict_bytes, ties to the lower Algorithm value. The bytes depend on the sizes, the ranks and
// where they are (hosts), never on the network or the compute speeds, so every rank finds the
// same.
Algorithm fewest_bytes_algorithm(const ModelInput& in);

// This machine's compute speeds for a codec, measured on n normal floats (capped at 16M; at
// least 64K): encode and decode_add per element (decode per entry for sparse codecs). Run at the
// size the calls have, since caches make small tensors faster per element, and long enough that
// ranks sharing a node measure at the same time. Each speed is the mean over the runs of a
// 10-20 ms window, so that where ranks outnumber the cores it includes their sharing.
ComputeModel measure_compute(const Codec& codec, std::size_t n = std::size_t{1} << 18);
// The same where `like` lives: for a device view (gcomp::cuda::view), the codec's device kernels
// timed on its device and stream, on device memory of its own (like's data are not read, and
// its size may differ from n); for a host view, the CPU codec as above. Throws Error(cuda) when
// the device memory cannot be had.
ComputeModel measure_compute(const Codec& codec, std::size_t n, TensorView<const float> like);
// Only the codec-independent parts (reduce, merge), measured the same way.
ComputeModel measure_reduce_and_merge();

// measure_network(MPI_Comm), this rank's measurement of the network among an MPI communicator's
// ranks, is in gcomp/communicator.hpp (it needs MPI; this header does not).

// A network model for a switched network of the given link rate (bits per second) and latency,
// for extrapolation: beta = beta_all = 8 / rate (full bisection bandwidth).
NetworkModel network_for_rate(double bits_per_second, double latency_seconds);

}  // namespace gcomp
