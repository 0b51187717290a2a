// The CUDA runtime side of gcomp_cuda: device discovery and a smoke test kernel.
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "gcomp/cuda.hpp"

namespace gcomp::cuda {

namespace {

__global__ void odd_numbers(unsigned* out, unsigned n) {
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    out[i] = 2 * i + 1;
  }
}

std::string describe(cudaError_t e, const char* what) {
  return std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

}  // namespace

DeviceStatus device_status() {
  DeviceStatus s;
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    s.why = describe(e, "cudaGetDeviceCount");
    cudaGetLastError();  // clear it
    return s;
  }
  s.count = count;
  if (count == 0) {
    s.why = "the CUDA runtime found no device";
    return s;
  }
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) == cudaSuccess) {
    s.name = p.name;
    s.capability = std::to_string(p.major) + "." + std::to_string(p.minor);
  }
  return s;
}

std::string smoke_test() {
  const DeviceStatus s = device_status();
  if (s.count == 0) return "no CUDA device: " + s.why;
  constexpr unsigned n = 1000003;
  unsigned* d = nullptr;
  cudaError_t e = cudaMalloc(&d, n * sizeof(unsigned));
  if (e != cudaSuccess) return describe(e, "cudaMalloc");
  odd_numbers<<<256, 256>>>(d, n);
  e = cudaGetLastError();
  std::vector<unsigned> h(n);
  if (e == cudaSuccess) e = cudaMemcpy(h.data(), d, n * sizeof(unsigned), cudaMemcpyDeviceToHost);
  cudaFree(d);
  if (e != cudaSuccess) return describe(e, "kernel launch or copy");
  for (unsigned i = 0; i < n; ++i) {
    if (h[i] != 2 * i + 1) {
      return "element " + std::to_string(i) + " is " + std::to_string(h[i]) + ", expected " +
             std::to_string(2 * i + 1);
    }
  }
  return {};
}

}  // namespace gcomp::cuda
