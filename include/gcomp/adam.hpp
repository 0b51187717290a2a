// Adam and AdamW (Kingma & Ba, ICLR 2015; Loshchilov & Hutter, ICLR 2019) as torch.optim
// computes them, and the two halves of 1-bit Adam's compressed stage (Tang et al., ICML 2021):
// after a warm-up of exact Adam, the variance is frozen and only the momentum crosses the
// network, compressed with error feedback. Element by element on host memory (library
// gcomp_core) or device memory (below); gcomp::CompressedAdam (compressed_adam.hpp) runs them
// around a Communicator, and gcomp.torch calls the same functions (docs/python.md, "Adam and
// AdamW"):
//
//   adam_local_momentum(p, g, m, g, s);             // g = beta1 m + (1 - beta1) g  (this rank's)
//   comm.allreduce(g, codec, &ef, {.average = true}) // the momentum averaged, error feedback
//   adam_frozen_update(p, g, m, v, s, lr, t, tv);  // m = g; p moves with the frozen v
//
// Every product and sum is rounded on its own (the library is built without fused
// multiply-adds), so a step's result does not depend on the compiler.
//
// Each function also takes TensorViews (gcomp/tensor.hpp): host views are the spans' loop, and
// device views (gcomp::cuda::view, library gcomp_cuda; all of one call's on one stream) run the
// same arithmetic as a CUDA kernel queued on that stream, not waited for, bit for bit the host's
// result (CUDA's float division and square root are IEEE's there, and nothing is fused). A call
// mixing host and device views, or two streams, is Error(invalid_argument).
#pragma once

#include <cstdint>
#include <span>

#include "gcomp/tensor.hpp"

namespace gcomp {

// The hyperparameters of one group of tensors, torch.optim.Adam's and AdamW's: betas in [0, 1),
// eps > 0 and weight_decay >= 0, all finite. decoupled: AdamW's weight decay, p *= 1 - lr wd
// before the update; otherwise Adam's L2 term, g += wd p, added to the gradient.
struct AdamSettings {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled = false;
};

// Throws Error(invalid_argument) naming the bad value; returns quietly otherwise.
void check_adam_settings(const AdamSettings& s);

// One step of exact Adam (AdamW when s.decoupled), torch.optim's formula, step = 1 for the
// first:
//   g' = g + wd p (Adam) | p *= 1 - lr wd (AdamW)
//   m = beta1 m + (1 - beta1) g';  v = beta2 v + (1 - beta2) g'^2
//   p -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
// The spans must have one size (Error(invalid_argument) otherwise, also for step 0, a bad
// setting or lr < 0).
//
// variance_steps (0: step) is the updates v has had, this one included, where it has had fewer
// than m (0/1 Adam's refresh of the variance after compressed steps, which moved only m): v's
// bias correction is then 1 - beta2^variance_steps, and m^ / (sqrt(v^) + eps) is bounded as in
// adam_frozen_update (m did not come from the gradients v saw). Error(invalid_argument) where it
// is above step.
void adam_step(std::span<float> param, std::span<const float> grad, std::span<float> exp_avg,
               std::span<float> exp_avg_sq, const AdamSettings& s, double lr, std::uint64_t step,
               std::uint64_t variance_steps = 0);

// The compressed stage, before the collective: this rank's momentum
//   out = beta1 m + (1 - beta1) g'   (g' = g + wd p for Adam, g for AdamW)
// which is what is compressed and averaged; m itself is not changed. out may be grad (the same
// memory, in place), not exp_avg or param. Errors as adam_step's.
void adam_local_momentum(std::span<const float> param, std::span<const float> grad,
                         std::span<const float> exp_avg, std::span<float> out,
                         const AdamSettings& s);

// The compressed stage, after the collective: m = momentum (the ranks' average, as received),
// and the parameter moves with the variance as it was last updated:
//   p *= 1 - lr wd (AdamW)
//   p -= lr * clamp(m^ / (sqrt(v^) + eps), +-max(1, (1 - beta1) / sqrt(1 - beta2)))
//   with m^ = m / (1 - beta1^step), v^ = v / (1 - beta2^variance_steps)
// step counts every step (the momentum's updates, warm-up included); variance_steps the updates
// v has had (the warm-up's steps when it is frozen after them), so that v's bias correction
// stays the one it had. The clamp is the bound exact Adam's step never exceeds (Kingma & Ba,
// section 2.1), which the frozen v no longer enforces: a 1-bit codec sends +-scale where the
// momentum is 0, and where v is small that would be a step without bound. Where v is 0 (the
// warm-up saw no gradient there) the element does not move but for AdamW's decay: 1-bit Adam's
// momentum mask, without the mask to give. momentum may be exp_avg (the same memory). Errors as
// adam_step's, also for variance_steps 0 or above step.
void adam_frozen_update(std::span<float> param, std::span<const float> momentum,
                        std::span<float> exp_avg, std::span<const float> exp_avg_sq,
                        const AdamSettings& s, double lr, std::uint64_t step,
                        std::uint64_t variance_steps);

// Local steps (0/1 Adam, Lu et al., ICML 2022): between two synchronizations each rank steps
// on its own momentum (adam_local_momentum, then adam_frozen_update with it); anchor is the
// parameter as the last synchronization left it, the same on every rank. lr_sum is the sum of
// the learning rates of the steps since (> 0), decay the product of their AdamW factors
// 1 - lr wd (1 for Adam). Before the collective, this rank's way from the anchor as a momentum:
//   out = (decay anchor - p) * (sqrt(v^) + eps) / lr_sum      (v^ = v / (1 - beta2^variance_steps))
// the lr-weighted mean of the bias-corrected m^ its steps took (exactly so where no bound cut
// them), which is what is compressed and averaged: with one local step it is adam_local_momentum's
// m^, so the error feedback's residual keeps its units. Errors as adam_frozen_update's, also for
// lr_sum <= 0 or decay outside (0, 1].
void adam_sync_momentum(std::span<const float> param, std::span<const float> anchor,
                        std::span<const float> exp_avg_sq, std::span<float> out,
                        const AdamSettings& s, double lr_sum, double decay,
                        std::uint64_t variance_steps);

// After the collective, momentum is the ranks' average of adam_sync_momentum's out:
//   p = decay anchor - lr_sum * clamp(momentum / (sqrt(v^) + eps), +-max(1, (1 - beta1) / sqrt(1 -
//   beta2))) anchor = p;  m = momentum * (1 - beta1^step)
// (an element whose v is 0 only decays), the same on every rank: the average of their ways, as
// compressed. m is the average momentum the steps took, as 0/1 Adam sets it. momentum may be
// exp_avg. Errors as adam_sync_momentum's, also for step below variance_steps.
void adam_sync_update(std::span<float> param, std::span<float> anchor,
                      std::span<const float> momentum, std::span<float> exp_avg,
                      std::span<const float> exp_avg_sq, const AdamSettings& s, double lr_sum,
                      double decay, std::uint64_t step, std::uint64_t variance_steps);

// The same functions on host or device views (see the top of this file).
void adam_step(TensorView<float> param, TensorView<const float> grad, TensorView<float> exp_avg,
               TensorView<float> exp_avg_sq, const AdamSettings& s, double lr, std::uint64_t step,
               std::uint64_t variance_steps = 0);
void adam_local_momentum(TensorView<const float> param, TensorView<const float> grad,
                         TensorView<const float> exp_avg, TensorView<float> out,
                         const AdamSettings& s);
void adam_frozen_update(TensorView<float> param, TensorView<const float> momentum,
                        TensorView<float> exp_avg, TensorView<const float> exp_avg_sq,
                        const AdamSettings& s, double lr, std::uint64_t step,
                        std::uint64_t variance_steps);
void adam_sync_momentum(TensorView<const float> param, TensorView<const float> anchor,
                        TensorView<const float> exp_avg_sq, TensorView<float> out,
                        const AdamSettings& s, double lr_sum, double decay,
                        std::uint64_t variance_steps);
void adam_sync_update(TensorView<float> param, TensorView<float> anchor,
                      TensorView<const float> momentum, TensorView<float> exp_avg,
                      TensorView<const float> exp_avg_sq, const AdamSettings& s, double lr_sum,
                      double decay, std::uint64_t step, std::uint64_t variance_steps);

}  // namespace gcomp
