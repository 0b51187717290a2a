// 1-bit Adam over a Communicator (include/gcomp/compressed_adam.hpp): the stage of each step,
// the collective it makes, and the element-wise halves of gcomp/adam.hpp around it.
#include "gcomp/compressed_adam.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "gcomp/error.hpp"

namespace gcomp {

namespace {

constexpr std::uint64_t kMaxCount = std::uint64_t{1} << 40;

}  // namespace

void AdamSchedule::check() const {
  const auto bad = [](const std::string& what) {
    throw Error(Status::invalid_argument, "AdamSchedule: " + what);
  };
  if (warmup_steps == 0) {
    bad("warmup_steps must be at least 1 (the variance frozen or refreshed after the warm-up is "
        "the one its exact steps estimated)");
  }
  if (max_local_steps == 0) bad("max_local_steps must be at least 1 (1: no local steps)");
  if (local_double_every == 0) bad("local_double_every must be at least 1");
  for (const auto& [name, value] : {std::pair{"warmup_steps", warmup_steps},
                                    {"refreshes_per_interval", refreshes_per_interval},
                                    {"freeze_step", freeze_step},
                                    {"max_local_steps", max_local_steps},
                                    {"local_double_every", local_double_every}}) {
    if (value > kMaxCount)
      bad(std::string(name) + " must be at most 2^40, not " + std::to_string(value));
  }
}

std::uint64_t AdamSchedule::frozen_after() const noexcept {
  return std::max(warmup_steps, freeze_step);
}

std::uint64_t AdamSchedule::variance_steps(std::uint64_t step) const noexcept {
  if (step <= warmup_steps || refreshes_per_interval == 0) return std::min(step, warmup_steps);
  const std::uint64_t end = std::min(step, frozen_after());
  std::uint64_t count = warmup_steps;
  std::uint64_t base = warmup_steps;  // the step before the interval's first
  for (std::uint64_t interval = 2; base < end; interval *= 2) {
    const std::uint64_t span = refreshes_per_interval * interval;
    if (end - base < span) return count + (end - base) / interval;
    count += refreshes_per_interval;
    base += span;
  }
  return count;
}

bool AdamSchedule::refreshes(std::uint64_t step) const noexcept {
  return step >= 1 && variance_steps(step) != variance_steps(step - 1);
}

bool AdamSchedule::local(std::uint64_t step) const noexcept {
  return max_local_steps > 1 && step > frozen_after();
}

bool AdamSchedule::synchronizes(std::uint64_t step) const noexcept {
  if (!local(step)) return true;
  const std::uint64_t q = step - frozen_after();  // the local stage's step, from 1
  const std::uint64_t doublings = (q - 1) / local_double_every;
  const std::uint64_t interval =
      doublings >= 40 ? max_local_steps : std::min(max_local_steps, std::uint64_t{1} << doublings);
  return q % interval == 0;
}

CompressedAdam::CompressedAdam(const Codec& codec, std::vector<MatrixShape> shapes,
                               const CompressedAdamOptions& options)
    : codec_(codec), none_("none"), shapes_(std::move(shapes)), options_(options) {
  check_adam_settings(options_.adam);
  options_.schedule.check();
  options_.bucket.allreduce.average = true;
  const bool local = options_.schedule.max_local_steps > 1;
  for (const MatrixShape& s : shapes_) {
    const std::size_t n = s.rows * s.cols;
    exp_avg_.emplace_back(n, 0.0f);
    exp_avg_sq_.emplace_back(n, 0.0f);
    if (local) anchor_.emplace_back(n, 0.0f);
    feedback_.emplace_back(options_.error_feedback ? n : 0);
  }
}

void CompressedAdam::step(Communicator& comm, std::span<const std::span<float>> params,
                          std::span<const std::span<float>> grads, double lr) {
  const std::size_t n = shapes_.size();
  if (params.size() != n || grads.size() != n) {
    throw Error(Status::invalid_argument, "CompressedAdam::step: " + std::to_string(params.size()) +
                                              " parameters and " + std::to_string(grads.size()) +
                                              " gradients for " + std::to_string(n) + " tensors");
  }
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t size = exp_avg_[i].size();
    if (params[i].size() != size || grads[i].size() != size) {
      throw Error(Status::invalid_argument, "CompressedAdam::step: tensor " + std::to_string(i) +
                                                " has " + std::to_string(size) +
                                                " elements, its parameter " +
                                                std::to_string(params[i].size()) +
                                                " and gradient " + std::to_string(grads[i].size()));
    }
  }
  if (!(lr >= 0) || !std::isfinite(lr)) {
    throw Error(Status::invalid_argument,
                "CompressedAdam::step: lr must be finite and >= 0, not " + std::to_string(lr));
  }
  const AdamSchedule& schedule = options_.schedule;
  const AdamSettings& s = options_.adam;
  const std::uint64_t t = steps_ + 1;
  sent_ = false;
  BucketOptions bo = options_.bucket;
  bo.allreduce.seed = step_seed(options_.bucket.allreduce.seed, steps_, 0);
  std::vector<ErrorFeedback*> efs;
  if (options_.error_feedback) {
    for (ErrorFeedback& f : feedback_) efs.push_back(&f);
  }
  if (schedule.refreshes(t)) {
    bo.allreduce.algorithm = Algorithm::dense;
    comm.allreduce_buckets(grads, none_, {}, bo);
    sent_ = true;
    for (std::size_t i = 0; i < n; ++i) {
      adam_step(params[i], grads[i], exp_avg_[i], exp_avg_sq_[i], s, lr, t, variance_steps_ + 1);
    }
    variance_steps_ += 1;
  } else if (!schedule.local(t)) {
    for (std::size_t i = 0; i < n; ++i) {
      adam_local_momentum(params[i], grads[i], exp_avg_[i], grads[i], s);
    }
    comm.allreduce_buckets(grads, shapes_, codec_, efs, bo);
    sent_ = true;
    for (std::size_t i = 0; i < n; ++i) {
      adam_frozen_update(params[i], grads[i], exp_avg_[i], exp_avg_sq_[i], s, lr, t,
                         variance_steps_);
    }
  } else {
    if (t - 1 == schedule.frozen_after()) {  // the local stage begins where the ranks agree
      for (std::size_t i = 0; i < n; ++i) std::ranges::copy(params[i], anchor_[i].begin());
      lr_sum_ = 0.0;
      decay_ = 1.0;
    }
    for (std::size_t i = 0; i < n; ++i) {
      adam_local_momentum(params[i], grads[i], exp_avg_[i], grads[i], s);
      adam_frozen_update(params[i], grads[i], exp_avg_[i], exp_avg_sq_[i], s, lr, t,
                         variance_steps_);
    }
    lr_sum_ += lr;
    if (s.decoupled) decay_ *= 1.0 - lr * s.weight_decay;
    if (schedule.synchronizes(t)) sync_local(comm, params, grads, t, 0);
  }
  steps_ = t;
}

void CompressedAdam::sync_local(Communicator& comm, std::span<const std::span<float>> params,
                                std::span<const std::span<float>> scratch, std::uint64_t t,
                                std::uint64_t index) {
  // lr_sum 0 (every step's lr 0): no rank moved, and none has a way to average.
  if (lr_sum_ > 0) {
    const AdamSettings& s = options_.adam;
    const std::size_t n = shapes_.size();
    BucketOptions bo = options_.bucket;
    bo.allreduce.seed = step_seed(options_.bucket.allreduce.seed, t - 1, index);
    std::vector<ErrorFeedback*> efs;
    if (options_.error_feedback) {
      for (ErrorFeedback& f : feedback_) efs.push_back(&f);
    }
    for (std::size_t i = 0; i < n; ++i) {
      adam_sync_momentum(params[i], anchor_[i], exp_avg_sq_[i], scratch[i], s, lr_sum_, decay_,
                         variance_steps_);
    }
    comm.allreduce_buckets(scratch, shapes_, codec_, efs, bo);
    sent_ = true;
    for (std::size_t i = 0; i < n; ++i) {
      adam_sync_update(params[i], anchor_[i], scratch[i], exp_avg_[i], exp_avg_sq_[i], s, lr_sum_,
                       decay_, t, variance_steps_);
    }
  }
  lr_sum_ = 0.0;
  decay_ = 1.0;
}

void CompressedAdam::synchronize(Communicator& comm, std::span<const std::span<float>> params) {
  check_params(params, "CompressedAdam::synchronize");
  sent_ = false;
  if (!options_.schedule.local(steps_) || lr_sum_ <= 0) return;
  std::vector<std::vector<float>> scratch;
  std::vector<std::span<float>> spans;
  for (const auto& m : exp_avg_) scratch.emplace_back(m.size());
  for (auto& x : scratch) spans.emplace_back(x);
  sync_local(comm, params, spans, steps_, 1);
}

void CompressedAdam::check_params(std::span<const std::span<float>> params, const char* who) const {
  const std::size_t n = shapes_.size();
  if (params.size() != n) {
    throw Error(Status::invalid_argument, std::string(who) + ": " + std::to_string(params.size()) +
                                              " parameters for " + std::to_string(n) + " tensors");
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (params[i].size() != exp_avg_[i].size()) {
      throw Error(Status::invalid_argument, std::string(who) + ": tensor " + std::to_string(i) +
                                                " has " + std::to_string(exp_avg_[i].size()) +
                                                " elements, its parameter " +
                                                std::to_string(params[i].size()));
    }
  }
}

void CompressedAdam::restore(std::uint64_t steps, std::uint64_t variance_steps, double local_lr_sum,
                             double local_decay) {
  const std::uint64_t expected = options_.schedule.variance_steps(steps);
  if (variance_steps != expected) {
    throw Error(Status::invalid_argument,
                "CompressedAdam::restore: after " + std::to_string(steps) +
                    " steps the schedule has refreshed the variance " + std::to_string(expected) +
                    " times, not " + std::to_string(variance_steps));
  }
  if (!std::isfinite(local_lr_sum) || local_lr_sum < 0 || !(local_decay > 0 && local_decay <= 1)) {
    throw Error(Status::invalid_argument,
                "CompressedAdam::restore: local_lr_sum must be finite and >= 0 and local_decay in "
                "(0, 1], not " +
                    std::to_string(local_lr_sum) + " and " + std::to_string(local_decay));
  }
  steps_ = steps;
  variance_steps_ = variance_steps;
  lr_sum_ = local_lr_sum;
  decay_ = local_decay;
}

}  // namespace gcomp
