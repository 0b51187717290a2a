// 1-bit Adam (Tang et al., ICML 2021) over a Communicator, for any codec (library gcomp_mpi):
// the first warmup_steps steps are exact Adam (AdamW) on the gradients averaged uncompressed;
// from then on the variance is frozen and each rank's momentum m_r = beta1 m + (1 - beta1) g_r
// is what crosses the network, through the codec with error feedback, and every rank applies
// the same averaged momentum with the frozen variance (gcomp/adam.hpp gives the formulas). With
// algorithm compressed_reduce_scatter the error feedback is on both sides, as in 1-bit Adam:
// each rank keeps the residual of what it compressed, each chunk's owner the residual of what it
// re-compressed (both in the tensor's ErrorFeedback). The parameters stay the same on every rank.
//
//   CompressedAdam adam(Codec("sign"), shapes, {.adam = {.weight_decay = 0.01, .decoupled = true},
//                                               .warmup_steps = 100});
//   for (...) { backward(grads); adam.step(comm, params, grads, lr); }
//
// Checkpoints: steps(), variance_steps() and each tensor's exp_avg, exp_avg_sq and feedback() (an
// ErrorFeedback copies with what the collectives keep beside its residual) are the whole state;
// restore() puts the counts back. gcomp.torch runs the same steps on torch's tensors.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "gcomp/adam.hpp"
#include "gcomp/codec.hpp"
#include "gcomp/communicator.hpp"

namespace gcomp {

struct CompressedAdamOptions {
  AdamSettings adam;
  // Exact Adam steps first, the gradients averaged as float32 (Algorithm::dense): at least 1, since
  // the frozen variance is the one these steps estimated.
  std::uint64_t warmup_steps = 1;
  // Keep the momentum's compression error and add it to the next step's (each rank's residual,
  // and the owners' under compressed_reduce_scatter). Off: every step's error is lost.
  bool error_feedback = true;
  // How the momenta go in the compressed stage: algorithm (automatic by default), seed,
  // allow_uncompressed, bucket_bytes, dense_below. average is set (the momenta are averaged);
  // each step's seed is step_seed(seed, step, 0).
  BucketOptions bucket;
};

class CompressedAdam {
 public:
  // The state of tensors of these shapes (rows * cols elements each; a low-rank codec reads them,
  // the others only the sizes): moments zero, no step taken. Throws Error(invalid_argument) for a
  // bad setting or warmup_steps 0.
  CompressedAdam(const Codec& codec, std::vector<MatrixShape> shapes,
                 const CompressedAdamOptions& options);

  // One step, collective over comm (every rank calls it with its own gradients, in the same
  // order): params[i] and grads[i] are tensor i, grads are consumed (overwritten). In warm-up the
  // averaged gradient goes into exact Adam; after it, the averaged momentum into the frozen-
  // variance update. comm.last_stats() then holds the step's collectives. Errors: a size that
  // is not the tensor's, lr < 0 (Error(invalid_argument), nothing changed), and the collective's
  // (a NaN in a gradient: Error(nonfinite) on every rank, the state as it was).
  void step(Communicator& comm, std::span<const std::span<float>> params,
            std::span<const std::span<float>> grads, double lr);

  std::size_t tensors() const noexcept { return shapes_.size(); }
  std::uint64_t steps() const noexcept { return steps_; }
  // The updates the variance has had (the warm-up's steps once it is over).
  std::uint64_t variance_steps() const noexcept { return variance_steps_; }
  // Whether the next step sends the momentum compressed (warm-up over).
  bool compressing() const noexcept { return steps_ >= options_.warmup_steps; }

  std::span<float> exp_avg(std::size_t i) { return exp_avg_.at(i); }
  std::span<float> exp_avg_sq(std::size_t i) { return exp_avg_sq_.at(i); }
  ErrorFeedback& feedback(std::size_t i) { return feedback_.at(i); }
  // Sets the step counts of a checkpoint (the tensors' state is set through the accessors above).
  // Throws Error(invalid_argument) when variance_steps is above steps, or is not
  // min(steps, warmup_steps).
  void restore(std::uint64_t steps, std::uint64_t variance_steps);

 private:
  Codec codec_;
  Codec none_;
  std::vector<MatrixShape> shapes_;
  CompressedAdamOptions options_;
  std::vector<std::vector<float>> exp_avg_, exp_avg_sq_;
  std::vector<ErrorFeedback> feedback_;
  std::uint64_t steps_ = 0;
  std::uint64_t variance_steps_ = 0;
};

}  // namespace gcomp
