// Adam's element-wise steps on device memory (gcomp/adam.hpp's functions on device views): one
// grid-stride kernel per function, whose per-element arithmetic is compressors/adam_kernel.hpp's,
// the very code the CPU loop runs. The library builds with --fmad=false and without fast math,
// so every product and sum is rounded on its own and every quotient and square root is IEEE's
// correctly rounded one: a parameter stepped on a GPU has the bits it has on a CPU.
#include "adam_kernel.hpp"
#include "codecs.cuh"

namespace gcomp::cuda::detail {

namespace {

using gcomp::detail::AdamArrays;
using gcomp::detail::AdamKernel;
using gcomp::detail::AdamOp;

template <AdamOp Op>
__global__ void adam_kernel(AdamKernel k, AdamArrays a, std::size_t n) {
  GCOMP_GRID_LOOP(i, n) gcomp::detail::adam_element<Op>(k, a, i);
}

template <AdamOp Op>
void launch(const AdamKernel& k, const AdamArrays& a, std::size_t n, cudaStream_t stream) {
  adam_kernel<Op><<<grid_for(n), kThreads, 0, stream>>>(k, a, n);
  GCOMP_LAUNCHED("adam");
}

}  // namespace

void adam(const AdamKernel& k, const AdamArrays& a, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  switch (k.op) {
    case AdamOp::step:
      return launch<AdamOp::step>(k, a, n, stream);
    case AdamOp::local_momentum:
      return launch<AdamOp::local_momentum>(k, a, n, stream);
    case AdamOp::frozen_update:
      return launch<AdamOp::frozen_update>(k, a, n, stream);
    case AdamOp::sync_momentum:
      return launch<AdamOp::sync_momentum>(k, a, n, stream);
    case AdamOp::sync_update:
      return launch<AdamOp::sync_update>(k, a, n, stream);
  }
}

}  // namespace gcomp::cuda::detail
