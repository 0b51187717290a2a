// DGC's momentum correction (Lin et al., ICLR 2018) for a compressor with error feedback: the
// velocity is what is compressed, the error-feedback residual is where the velocities
// accumulate, and a velocity is zeroed where its accumulated value was sent (momentum factor
// masking). One implementation, called by gcomp.torch's hook and DistributedOptimizer (through
// the Python module's momentum_correct and mask_momentum) and usable from C++ directly:
//
//   momentum_correct(u, g, m);                  // u = m u + g; g = u
//   comm.allreduce(g, codec, &ef);              // g sent with error feedback (ef accumulates)
//   mask_momentum(u, ef.residual());            // u = 0 where the residual is 0 (sent)
//   parameters -= lr * g;                       // with an optimizer without momentum
#pragma once

#include <span>

namespace gcomp {

// velocity = momentum * velocity + grad, then grad = velocity, element by element (each product
// and sum rounded on its own). The spans must have one size; momentum in [0, 1). Throws
// Error(invalid_argument) otherwise.
void momentum_correct(std::span<float> velocity, std::span<float> grad, float momentum);

// Momentum factor masking: velocity = 0 wherever residual == 0 (the accumulated value was sent),
// unless the whole residual is zero: a tensor sent whole (warm-up, sent uncompressed) delayed
// nothing, and its update is plain momentum SGD. Returns whether it masked. The spans must have
// one size (Error(invalid_argument) otherwise).
bool mask_momentum(std::span<float> velocity, std::span<const float> residual);

}  // namespace gcomp
