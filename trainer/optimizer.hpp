// The second half of a data-parallel SGD step (train.hpp describes the whole): once every rank
// holds its local gradients in its parameters' grad, they are exchanged through gcomp (codec,
// error feedback on the velocity or on the gradient, or DGC), momentum is applied, and the values
// move. With periodic averaging (Config::period > 1) the local steps send nothing and the models
// are averaged on a schedule instead. Separate from the training loop so that the update rules
// can be tested on gradients a test chooses.
#pragma once

#include <cstdint>
#include <deque>
#include <future>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "gcomp/communicator.hpp"
#include "gcomp/compressed_adam.hpp"
#include "layers.hpp"
#include "train.hpp"

namespace gcomp::train {

// "dgc:ratio=R[,clip=C]" parsed; anything else is not DGC (on = false). Throws Error naming the
// spec for a malformed DGC spec.
struct Dgc {
  bool on = false;
  double ratio = 0.001;
  double clip = 0;
};
Dgc parse_dgc(const std::string& spec);

class Optimizer {
 public:
  // The state (velocities, error-feedback memories, DGC accumulations) of params, all zero.
  // The params must outlive the Optimizer.
  Optimizer(const Config& c, std::vector<Param*> params);

  // One step, collective over comm: the params' grad (consumed) averaged over ranks as the
  // configuration says, then values -= lr * step. compress: false in warm-up epochs (float32,
  // dense); dgc_density: the fraction DGC sends this epoch (dgc_ratio()); step_index (counted
  // from 0 over the run) seeds the codec's draws. Adds the bytes sent and the seconds spent to
  // stats. A local step (local(step_index)) is this rank's alone, not collective: momentum SGD
  // on its own grad, nothing sent.
  void step(Communicator& comm, double lr, bool compress, double dgc_density,
            std::uint64_t step_index, EpochRecord& stats);

  // Periodic averaging, after step(): where the schedule has an average after it (steps taken -
  // period_from a positive multiple of period), the ranks' models averaged, collective; returns
  // whether it averaged. An average sends each parameter's change since its anchor, anchor -
  // value, through the codec (float32 and dense after a step in a warm-up epoch) with error
  // feedback of its own, then anchor -= outer_lr * d (d the average; with outer momentum
  // b = mu b + avg, d = avg + mu b) and value = anchor, the same bits on every rank; the
  // velocities as momentum_at_average says. Adds its bytes and seconds to stats and counts it
  // in stats.averages. Nothing with period 1. Streaming (Config::fragments, overlap_steps): the
  // fragments' averages start on their own steps and are merged overlap_steps later (their
  // collectives on a thread of their own meanwhile: comm is not to be used by the caller until
  // synchronize() or the merge); returns whether one started or merged.
  bool average_if_due(Communicator& comm, EpochRecord& stats);

  // The ranks agree now, collective, so that every rank evaluates the same model: 0/1 Adam's
  // local steps averaged (CompressedAdam::synchronize), periodic averaging's local steps since
  // the last average averaged by one more (the schedule's averages keep their steps); nothing
  // where they agree.
  void synchronize(Communicator& comm, EpochRecord& stats);

  // Whether step step_index (from 0) is a local one: period > 1 and step_index >= period_from.
  bool local(std::uint64_t step_index) const noexcept;

  // The averages' error-feedback memories of the parameters' changes, one per piece (per
  // parameter with one fragment; empty without error feedback, or before the first compressed
  // average). For tests.
  std::span<const ErrorFeedback> average_feedback() const noexcept { return periodic_.memories; }

 private:
  void dgc_step(Communicator& comm, double lr, double density, const AllreduceOptions& opt,
                EpochRecord& stats);
  void adam_step(Communicator& comm, double lr, const BucketOptions& bucket, EpochRecord& stats);
  void momentum_update(std::size_t i, float lr);
  void local_step(float lr, EpochRecord& stats);
  struct Flight;
  void make_fragments();
  // Streaming's two halves (average_if_due): the fragments' changes handed to the collective
  // (on a thread of its own where overlap > 0, merged that many steps later; paced, in parts),
  // and its result merged (what is left of its parts sent first).
  void start(Communicator& comm, const std::vector<std::size_t>& fragments,
             std::uint64_t overlap, EpochRecord& stats);
  void merge(Communicator& comm, Flight& f, EpochRecord& stats);
  // Hands f's next part to its collective: at once (no overlap), else on a thread of its own
  // after every collective handed on before it (never two in MPI at once, in the same order on
  // every rank).
  void send(Communicator& comm, Flight& f, EpochRecord& stats);

  Config c_;
  Dgc dgc_;
  std::vector<Param*> params_;
  std::vector<std::vector<float>> velocity_;
  std::vector<ErrorFeedback> memories_;
  std::vector<ErrorFeedback*> efs_;
  // DGC: each large tensor's error feedback, where its velocities accumulate (empty for the
  // tensors below dense_below, which go dense).
  std::vector<ErrorFeedback> dgc_memories_;
  std::vector<std::span<float>> grads_;
  std::vector<MatrixShape> shapes_;  // the parameters' (for the low-rank codecs)
  Codec none_;
  Codec codec_;
  bool velocity_ef_;
  BucketOptions bucket_;
  // adam, adamw: 1-bit Adam, made at the first step (its algorithm depends on the ranks).
  std::optional<CompressedAdam> adam_;
  // The last step(): the steps taken (its step_index + 1) and whether it compressed.
  std::uint64_t taken_ = 0;
  bool compress_ = true;
  // One fragment's part of a parameter: its elements [lo, hi), whole rows.
  struct Piece {
    std::size_t param = 0;
    std::size_t lo = 0, hi = 0;
  };
  // One collective of an average: its tensors (indices into Flight::changes), their spans,
  // shapes and error feedback, and its statistics' future where it runs on a thread.
  struct Part {
    std::vector<std::size_t> tensors;
    std::vector<std::span<float>> xs;
    std::vector<MatrixShape> shapes;
    std::vector<ErrorFeedback*> efs;
    std::shared_future<CallStats> done;
  };
  // An average started and not merged: its pieces (indices into Periodic::pieces), the steps
  // taken at its start and at its merge, the changes (then the averages; the velocities' after
  // the values'), the values at the start (overlap only) and its parts (one; paced, part j
  // handed on after the j-th step from its start), sent of them handed on.
  struct Flight {
    std::vector<std::size_t> pieces;
    std::uint64_t taken = 0, merge_at = 0;
    bool whole = false;  // every fragment
    std::vector<std::vector<float>> changes;
    std::vector<std::vector<float>> starts;
    std::vector<Part> parts;
    std::size_t sent = 0;
  };
  // Periodic averaging's state (Config::period > 1); the anchors, the outer momentum and the
  // velocities' anchors (per parameter) are the same on every rank; residuals and carries are
  // per piece.
  struct Periodic {
    bool started = false;              // the first local step ran: anchors made, residuals folded
    std::uint64_t averaged_after = 0;  // the steps taken at the last start or merge (0: none yet)
    std::uint64_t agreed_after = 0;    // the steps taken when every rank last had one model
    std::vector<std::vector<Piece>> fragments;  // Config::fragments of them, in order
    std::vector<Piece> pieces;                  // the fragments' pieces, in order
    std::vector<std::size_t> fragment_of;       // each piece's fragment
    std::vector<std::size_t> part_of;  // pacing (overlap_steps >= 2): each piece's part, 0, 1, ..
    std::vector<std::vector<float>> anchors;  // the values at the last average
    std::vector<std::vector<float>> outer;    // the outer Nesterov momentum b (outer_momentum)
    std::vector<std::vector<float>> velocity_anchors;  // "average": the velocities' anchors
    std::vector<ErrorFeedback> memories;           // the changes' residuals (error feedback)
    std::vector<ErrorFeedback> velocity_memories;  // "average": the velocities' changes'
    std::vector<std::vector<float>> carry;           // overlap: each piece's progress carried
    std::vector<std::vector<float>> velocity_carry;  // and its velocity's ("average")
    std::deque<Flight> flights;                      // oldest first
    std::shared_future<CallStats> last;  // the collective handed on last (on a thread)
  };
  Periodic periodic_;
};

}  // namespace gcomp::train
