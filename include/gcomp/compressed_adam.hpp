// 1-bit Adam (Tang et al., ICML 2021) and 0/1 Adam (Lu et al., ICML 2022) over a Communicator,
// for any codec (library gcomp_mpi). The first warmup_steps steps are exact Adam (AdamW) on the
// gradients averaged uncompressed; from then on the variance is frozen (1-bit Adam) or refreshed
// on 0/1 Adam's schedule, and each rank's momentum m_r = beta1 m + (1 - beta1) g_r is what
// crosses the network, through the codec with error feedback, and every rank applies the same
// averaged momentum with the variance as it was last refreshed (gcomp/adam.hpp gives the
// formulas). With local steps (0/1 Adam's second half) the ranks step on their own momenta
// between synchronizations, which average their ways since the last one, compressed the same
// way. With algorithm compressed_reduce_scatter the error feedback is on both sides, as in 1-bit
// Adam: each rank keeps the residual of what it compressed, each chunk's owner the residual of
// what it re-compressed (both in the tensor's ErrorFeedback). The parameters are the same on
// every rank after every synchronized step.
//
//   CompressedAdam adam(Codec("sign"), shapes, {.adam = {.weight_decay = 0.01, .decoupled = true},
//                                               .schedule = AdamSchedule::one_bit(100)});
//   for (...) { backward(grads); adam.step(comm, params, grads, lr); }
//
// Checkpoints: steps(), variance_steps(), local_lr_sum(), local_decay() and each tensor's
// exp_avg, exp_avg_sq, anchor (local steps) and feedback() (an ErrorFeedback copies with what the
// collectives keep beside its residual) are the whole state; restore() puts the counts back.
// gcomp.torch runs the same steps on torch's tensors.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "gcomp/adam.hpp"
#include "gcomp/codec.hpp"
#include "gcomp/communicator.hpp"

namespace gcomp {

// Which steps refresh the variance (an exact step on the gradients averaged as float32) and
// which synchronize the ranks, as a function of the step (1 for the first), so that a resumed job
// needs only its step count. 1-bit Adam's (one_bit): steps 1..warmup_steps exact, then the
// variance frozen and every step synchronized. 0/1 Adam's (zero_one): after the warm-up the
// variance is refreshed every 2nd step for refreshes_per_interval refreshes, then every 4th for
// as many, every 8th, ... until freeze_step; after freeze_step, local steps: the ranks
// synchronize every step for local_double_every steps, then every 2nd step for as many, every
// 4th, ... at most every max_local_steps-th.
struct AdamSchedule {
  std::uint64_t warmup_steps = 1;            // at least 1: the variance needs an estimate
  std::uint64_t refreshes_per_interval = 0;  // 0/1 Adam's kappa; 0: frozen after the warm-up
  std::uint64_t freeze_step = 0;             // the last step that may refresh (0: warmup_steps)
  std::uint64_t max_local_steps = 1;         // 0/1 Adam's H; 1: no local steps
  std::uint64_t local_double_every = 1;      // steps at one local interval before it doubles

  static AdamSchedule one_bit(std::uint64_t warmup_steps) { return {.warmup_steps = warmup_steps}; }
  // 0/1 Adam's: the warm-up is kappa steps (the first interval's refreshes), freeze_step the last
  // refresh (DeepSpeed's var_freeze_step: the learning rate's warm-up end, say).
  static AdamSchedule zero_one(std::uint64_t freeze_step, std::uint64_t kappa = 16,
                               std::uint64_t max_local_steps = 16,
                               std::uint64_t local_double_every = 32) {
    return {.warmup_steps = kappa,
            .refreshes_per_interval = kappa,
            .freeze_step = freeze_step,
            .max_local_steps = max_local_steps,
            .local_double_every = local_double_every};
  }

  friend bool operator==(const AdamSchedule&, const AdamSchedule&) = default;

  // Throws Error(invalid_argument) naming the bad value: warmup_steps, max_local_steps or
  // local_double_every 0, a count above 2^40.
  void check() const;
  // max(warmup_steps, freeze_step): the last step that may refresh the variance, after which
  // the local steps begin (without refreshes, the steps between warmup_steps and freeze_step
  // are 1-bit Adam's).
  std::uint64_t frozen_after() const noexcept;
  // The refreshes among steps 1..step (the variance's updates after them).
  std::uint64_t variance_steps(std::uint64_t step) const noexcept;
  bool refreshes(std::uint64_t step) const noexcept;
  // Whether the ranks step on their own at this step (after frozen_after, with local steps).
  bool local(std::uint64_t step) const noexcept;
  // Whether the ranks are synchronized after this step: every step but the local ones that do
  // not end an interval.
  bool synchronizes(std::uint64_t step) const noexcept;
};

struct CompressedAdamOptions {
  AdamSettings adam;
  // When the variance is refreshed and the ranks synchronize: 1-bit Adam after one exact step by
  // default (1-bit Adam runs 15-25% of the steps exact: AdamSchedule::one_bit(W)).
  AdamSchedule schedule;
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
  // bad setting or schedule.
  CompressedAdam(const Codec& codec, std::vector<MatrixShape> shapes,
                 const CompressedAdamOptions& options);

  // One step, collective over comm (every rank calls it with its own gradients, in the same
  // order): params[i] and grads[i] are tensor i, grads are consumed (overwritten). A refreshing
  // step puts the averaged gradient into exact Adam; the others the averaged momentum into the
  // update with the variance as last refreshed; a local step moves this rank's parameters with
  // its own momentum and, where it ends an interval, averages the ranks' ways since the last
  // synchronization. comm.last_stats() then holds the step's collectives (a local step that
  // does not synchronize makes none and leaves it as it was). Errors: a size that is not the
  // tensor's, lr < 0 (Error(invalid_argument), nothing changed), and the collective's (a NaN in
  // a gradient: Error(nonfinite) on every rank, the state as it was).
  void step(Communicator& comm, std::span<const std::span<float>> params,
            std::span<const std::span<float>> grads, double lr);

  // Local steps: averages the ranks' parameters now, as a synchronization the schedule has not
  // reached yet (collective: every rank calls it after the same step), so that every rank has
  // the same model to evaluate or save; the schedule's own synchronizations go on as before.
  // Nothing is sent where the ranks already agree (outside the local stage, or right after a
  // synchronization). Errors as step's.
  void synchronize(Communicator& comm, std::span<const std::span<float>> params);

  std::size_t tensors() const noexcept { return shapes_.size(); }
  // Whether the last step made a collective (comm.last_stats() is then its).
  bool last_step_sent() const noexcept { return sent_; }
  std::uint64_t steps() const noexcept { return steps_; }
  // The updates the variance has had (schedule.variance_steps(steps())).
  std::uint64_t variance_steps() const noexcept { return variance_steps_; }
  // Whether the next step sends the momentum compressed, or is local (no exact step).
  bool compressing() const noexcept { return !options_.schedule.refreshes(steps_ + 1); }
  const AdamSchedule& schedule() const noexcept { return options_.schedule; }

  std::span<float> exp_avg(std::size_t i) { return exp_avg_.at(i); }
  std::span<float> exp_avg_sq(std::size_t i) { return exp_avg_sq_.at(i); }
  // The parameters as the last synchronization left them (local steps only; empty otherwise).
  std::span<float> anchor(std::size_t i) {
    return anchor_.empty() ? std::span<float>() : anchor_.at(i);
  }
  ErrorFeedback& feedback(std::size_t i) { return feedback_.at(i); }
  // Since the last synchronization (local steps): the sum of the steps' learning rates and the
  // product of their AdamW factors 1 - lr wd.
  double local_lr_sum() const noexcept { return lr_sum_; }
  double local_decay() const noexcept { return decay_; }
  // Sets the counts of a checkpoint (the tensors' state is set through the accessors above).
  // Throws Error(invalid_argument) when variance_steps is not schedule.variance_steps(steps), or
  // lr_sum < 0 or decay outside (0, 1].
  void restore(std::uint64_t steps, std::uint64_t variance_steps, double local_lr_sum = 0.0,
               double local_decay = 1.0);

 private:
  Codec codec_;
  Codec none_;
  std::vector<MatrixShape> shapes_;
  CompressedAdamOptions options_;
  std::vector<std::vector<float>> exp_avg_, exp_avg_sq_, anchor_;
  std::vector<ErrorFeedback> feedback_;
  std::uint64_t steps_ = 0;
  std::uint64_t variance_steps_ = 0;
  double lr_sum_ = 0.0;
  double decay_ = 1.0;
  bool sent_ = false;

  void check_params(std::span<const std::span<float>> params, const char* who) const;
  // The local stage's synchronization after step t (lr_sum_ > 0), grads as scratch.
  void sync_local(Communicator& comm, std::span<const std::span<float>> params,
                  std::span<const std::span<float>> scratch, std::uint64_t t, std::uint64_t index);
};

}  // namespace gcomp
