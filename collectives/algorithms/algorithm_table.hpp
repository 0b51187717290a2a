// The allreduce algorithms as a table: one row per algorithm, each defined in the algorithm's
// own file beside its run function (in designated initializers). A row says what the algorithm
// is called, which codecs it runs, whether auto considers it for a codec, what the cost model
// predicts for it, how it runs on host and device tensors and what the call must know of it. The
// Communicator, the cost model and the device path read the table and name no algorithm. Adding
// an algorithm: docs/algorithms.md, "Adding an algorithm".
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>

#include "algorithms.hpp"
#include "gcomp/cost_model.hpp"

namespace gcomp::detail {

// What a stateful algorithm remembers of one tensor between calls, kept by the Communicator per
// tensor (its spec, size, AllreduceOptions::tensor and bucket layout: the same tensor from step
// to step, whatever its seed) and made by the row's make_state on first use. Every rank derives
// it from data all ranks hold, so all hold the same: the agreement compares signature() and every
// rank calls forget() when they differ (a rank missed a call, or forgot).
struct TensorState {
  virtual ~TensorState() = default;
  virtual std::uint64_t signature() const = 0;  // a hash of what it holds; 0 when it holds nothing
  virtual void forget() = 0;
};

// One bucket of allreduce_buckets as the state hooks see it: this rank of size, a bucket of len
// elements whose tensor t is [begin[t], begin[t] + n[t]), with efs[t] its error feedback (or
// null: it contributes zeros and keeps nothing).
struct BucketParts {
  int rank = 0;
  int size = 1;
  std::uint64_t len = 0;
  std::span<const std::uint64_t> begin;
  std::span<const std::uint64_t> n;
  std::span<ErrorFeedback* const> efs;
};

struct AlgorithmRow {
  Algorithm id;
  const char* name;         // as GCOMP_ALGORITHM, AllreduceOptions and the benchmarks spell it
  const char* description;  // one line: what it sends and who sums
  // Runs only sparse codecs (top-k, random-k, threshold): its streams are (index, value)
  // entries. The others run every codec.
  bool sparse_only;
  // Runs only the low-rank codecs (powersgd: CodecProperties::low_rank), which run nothing else.
  bool low_rank = false;
  // Runs every codec, whatever the two flags above say (two_level: each family's one-level
  // algorithm across hosts).
  bool any_codec = false;
  // Encodes only after the agreement (two_level: each host's sum): a call that asks for it, or
  // that auto expects to run it, encodes nothing before (if auto runs another, that one encodes).
  bool encodes_after_agreement = false;
  // Its run finds a sum that overflowed float32 itself (compressed_reduce_scatter: an owner that
  // cannot re-encode its chunk), so the call does not check its result again.
  bool checks_sum = false;
  // The row AllreduceOptions::majority_vote runs on (allgather: the signs summed where each
  // rank holds every rank's); exactly one row says so.
  bool majority_vote = false;
  // Whether auto weighs it for the codec ModelInput describes (in.sparse, in.codec_none), where
  // the row runs that codec (row_suits).
  bool (*candidate)(const ModelInput& in);
  // The model's seconds (docs/algorithms.md derives each formula); kNotApplicable where it does
  // not apply.
  double (*predict)(const ModelInput& in);
  // The model's bytes sent per rank (payloads and the collectives' own size exchanges, not the
  // agreement), for the scaling tables.
  double (*bytes)(const ModelInput& in);
  // The codec's speeds as this row's model counts them, measured on about n elements where
  // `like` lives (host memory, or its device and stream); null: the codec's encode and
  // decode_add (measure_compute).
  ComputeModel (*measure)(const Codec& codec, std::size_t n,
                          TensorView<const float> like) = nullptr;
  // Host tensors: job.in / job.out.
  void (*run)(Job& job);
  // Device tensors (buf.dev set): null runs `run` on the host staging and copies the result
  // to the device.
  void (*run_device)(Job& job);

  // ---- State: null for an algorithm without ----
  // State of a tensor kept by the Communicator (TensorState); run finds it in job.state.
  std::unique_ptr<TensorState> (*make_state)() = nullptr;
  // State kept in the caller's ErrorFeedback (its slot, compressors/feedback_slot.hpp), so
  // that it moves with the residual: how allreduce_buckets joins a bucket's tensors' states
  // into the bucket's before the call (or leaves it empty: it starts from zero) and splits it
  // back after a call that succeeded.
  void (*join_state)(const BucketParts& parts, ErrorFeedback& bucket) = nullptr;
  void (*split_state)(const BucketParts& parts, const ErrorFeedback& bucket) = nullptr;
  // A hash of that state (0 while it holds nothing), which the agreement compares so that
  // ranks whose states differ fail alike rather than sum different things.
  std::uint64_t (*state_signature)(const ErrorFeedback& ef) = nullptr;
};

// The states of the tensors a Communicator has reduced, one per stateful algorithm that suits
// the tensor's codec, by tensor key. Bounded: past kMaxTensors tensors it forgets them all and
// starts again (every rank alike, since every rank makes the same calls; a rank that differs is
// caught by the agreement's signature).
class StateStore {
 public:
  static constexpr std::size_t kMaxTensors = 4096;
  struct States {
    std::unique_ptr<TensorState> of[kAlgorithmCount];  // by algorithm value; null: none
    // A hash of every state's signature, 0 while none holds anything (the agreement's).
    std::uint64_t signature() const;
    void forget();
  };
  // The tensor's states, made on first use for every row with make_state (sparse_only rows
  // only for a sparse codec).
  States& of(std::uint64_t key, bool sparse_codec);

 private:
  std::unordered_map<std::uint64_t, States> map_;
};

// The algorithm a call runs without the codec (codec none, auto skipping the codec, the small
// tensors of allreduce_buckets): the transport's own float32 sum. The layers above the table
// name this role, never an algorithm.
inline constexpr Algorithm kUncompressed = Algorithm::dense;

// The row of AllreduceOptions::majority_vote (the one with majority_vote set).
const AlgorithmRow& majority_vote_row();

// Whether the rows' steps inside a host go through shared memory on this Communicator (its
// workspace): unless GCOMP_HOST_MEMORY=0 or its host's ranks found they cannot share it. The
// cost model's ModelInput::host_memory.
bool host_memory_shared(Workspace& ws);

// Every algorithm but automatic, in the order of gcomp::Algorithm. The first call checks the
// table (check_algorithm_table) and throws Error(internal) if it is wrong.
std::span<const AlgorithmRow* const> algorithm_rows();
// The row of an algorithm (not automatic).
const AlgorithmRow& algorithm_row(Algorithm a);
// Throws Error(internal) unless rows holds kAlgorithmCount - 1 rows, none null, row i's id
// i + 1, each with a distinct non-empty name, a description and the functions every row needs
// (and join_state and split_state both or neither, state_signature only with them).
void check_algorithm_table(std::span<const AlgorithmRow* const> rows);

// Whether a row runs a codec of these properties (sparse_only rows sparse codecs; low_rank rows
// the low-rank codecs and the others everything else).
inline bool row_suits(const AlgorithmRow& row, const CodecProperties& p) {
  return row.any_codec || (row.low_rank == p.low_rank && (!row.sparse_only || p.sparse));
}
inline bool row_suits(const AlgorithmRow& row, const ModelInput& in) {
  return in.codec ? row_suits(row, in.codec->properties())
                  : row.any_codec || (!row.low_rank && (!row.sparse_only || in.sparse));
}

// The complaint when a codec that needs each tensor's shape (CodecProperties::needs_shapes) is
// called without them ("" when it needs none).
inline std::string shapes_missing(const Codec& codec) {
  if (!codec.properties().needs_shapes) return {};
  return codec.spec() +
         " needs each tensor's shape: use Communicator::allreduce_buckets with shapes (the C "
         "API's gcomp_allreduce_buckets_shaped, the module's allreduce_buckets with shapes=)";
}

// Candidate rules shared by rows.
inline bool for_sparse_codecs(const ModelInput& in) { return in.sparse && !in.codec_none; }
inline bool for_dense_codecs(const ModelInput& in) { return !in.sparse && !in.codec_none; }

}  // namespace gcomp::detail
