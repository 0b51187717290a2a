// The slot an ErrorFeedback keeps beside its residual for the collectives (host memory in both
// modes, empty until an algorithm sizes it, cleared by reset(), copied and moved with the
// residual): compressed_reduce_scatter keeps its owner-side residual there, so that all error
// feedback state stays in the caller's objects. Reached only from gcomp's own code.
#pragma once

#include <vector>

#include "gcomp/codec.hpp"

namespace gcomp::detail {

struct FeedbackSlot {
  static std::vector<float>& of(ErrorFeedback& ef) noexcept { return ef.slot_; }
  static const std::vector<float>& of(const ErrorFeedback& ef) noexcept { return ef.slot_; }
  // A host memory made n zeros long (with `zero`; else n values left as they were, for a
  // caller that writes every one) with its slot empty, keeping its buffers' capacity: the one
  // memory allreduce_buckets reuses for every bucket, which then allocates nothing once warm.
  // Not for device memory (Error(internal)).
  static void reuse(ErrorFeedback& ef, std::size_t n, bool zero = true) {
    if (ef.device_) throw Error(Status::internal, "FeedbackSlot::reuse on device memory");
    ef.n_ = n;
    if (zero) {
      ef.residual_.assign(n, 0.0f);
    } else {
      ef.residual_.resize(n);
    }
    ef.slot_.clear();
  }
};

}  // namespace gcomp::detail
