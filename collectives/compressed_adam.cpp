// 1-bit Adam over a Communicator (include/gcomp/compressed_adam.hpp): the stage of each step,
// the collective it makes, and the element-wise halves of gcomp/adam.hpp around it.
#include "gcomp/compressed_adam.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "gcomp/error.hpp"

namespace gcomp {

CompressedAdam::CompressedAdam(const Codec& codec, std::vector<MatrixShape> shapes,
                               const CompressedAdamOptions& options)
    : codec_(codec), none_("none"), shapes_(std::move(shapes)), options_(options) {
  check_adam_settings(options_.adam);
  if (options_.warmup_steps == 0) {
    throw Error(Status::invalid_argument,
                "CompressedAdam: warmup_steps must be at least 1 (the variance frozen after the "
                "warm-up is the one its exact steps estimated)");
  }
  options_.bucket.allreduce.average = true;
  for (const MatrixShape& s : shapes_) {
    const std::size_t n = s.rows * s.cols;
    exp_avg_.emplace_back(n, 0.0f);
    exp_avg_sq_.emplace_back(n, 0.0f);
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
  const std::uint64_t t = steps_ + 1;
  BucketOptions bo = options_.bucket;
  bo.allreduce.seed = step_seed(options_.bucket.allreduce.seed, steps_, 0);
  if (!compressing()) {
    bo.allreduce.algorithm = Algorithm::dense;
    comm.allreduce_buckets(grads, none_, {}, bo);
    for (std::size_t i = 0; i < n; ++i) {
      adam_step(params[i], grads[i], exp_avg_[i], exp_avg_sq_[i], options_.adam, lr, t);
    }
    variance_steps_ = t;
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      adam_local_momentum(params[i], grads[i], exp_avg_[i], grads[i], options_.adam);
    }
    std::vector<ErrorFeedback*> efs;
    if (options_.error_feedback) {
      for (ErrorFeedback& f : feedback_) efs.push_back(&f);
    }
    comm.allreduce_buckets(grads, shapes_, codec_, efs, bo);
    for (std::size_t i = 0; i < n; ++i) {
      adam_frozen_update(params[i], grads[i], exp_avg_[i], exp_avg_sq_[i], options_.adam, lr, t,
                         variance_steps_);
    }
  }
  steps_ = t;
}

void CompressedAdam::restore(std::uint64_t steps, std::uint64_t variance_steps) {
  const std::uint64_t expected = std::min(steps, options_.warmup_steps);
  if (variance_steps != expected) {
    throw Error(Status::invalid_argument, "CompressedAdam::restore: after " +
                                              std::to_string(steps) + " steps with a warm-up of " +
                                              std::to_string(options_.warmup_steps) +
                                              " the variance has had " + std::to_string(expected) +
                                              " updates, not " + std::to_string(variance_steps));
  }
  steps_ = steps;
  variance_steps_ = variance_steps;
}

}  // namespace gcomp
