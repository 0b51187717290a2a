// Adam's functions (gcomp/adam.hpp) on device memory: the CUDA kernels against the CPU's loop,
// bit for bit (adam_device_cases.hpp), at sizes 0, 1, odd and a few grids' worth, on the legacy
// default stream and on the per-thread one. Skips with the runtime's reason without a GPU.
#include <gtest/gtest.h>

#include <vector>

#include "adam_device_cases.hpp"
#include "gcomp/cuda.hpp"

namespace {

// Device copies for adam_device_cases.hpp, viewed on `stream`.
struct CudaMemory {
  explicit CudaMemory(void* s) : stream(s) {}
  gcomp::TensorView<float> upload(const std::vector<float>& x) {
    buffers.emplace_back(std::span<const float>(x));
    return buffers.back().view(stream);
  }
  std::vector<float> download(gcomp::TensorView<float> v) const {
    gcomp::cuda::synchronize(stream);
    std::vector<float> out(v.size());
    if (!out.empty()) gcomp::cuda::copy(out.data(), v.data(), v.size() * sizeof(float));
    return out;
  }
  void* stream;
  std::vector<gcomp::cuda::DeviceBuffer<float>> buffers;
};

TEST(CudaAdam, EveryFunctionGivesTheCpusBits) {
  const gcomp::cuda::DeviceStatus s = gcomp::cuda::device_status();
  if (s.count == 0) GTEST_SKIP() << "no usable CUDA device: " << s.why;
  // cudaStreamPerThread is the handle 2 (cuda_runtime_api.h).
  for (void* stream : {static_cast<void*>(nullptr), reinterpret_cast<void*>(2)}) {
    for (const std::size_t n :
         {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{1000003}}) {
      CudaMemory mem(stream);
      gcomp::test::expect_adam_on_device_as_on_host(mem, n);
    }
  }
}

}  // namespace
