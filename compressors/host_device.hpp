// GCOMP_HOST_DEVICE: __host__ __device__ under nvcc, nothing for the host compiler. It marks the
// arithmetic that the CPU codecs (or their tests) and the CUDA kernels share.
#pragma once

#if defined(__CUDACC__)
#define GCOMP_HOST_DEVICE __host__ __device__
#else
#define GCOMP_HOST_DEVICE
#endif
