// gcomp's CUDA backend (library gcomp_cuda, built when nvcc is found). So far it answers whether a
// usable GPU is there; the codecs' kernels are to follow (see cuda/README.md).
#pragma once

#include <string>

namespace gcomp::cuda {

struct DeviceStatus {
  int count = 0;    // CUDA devices this process can use
  std::string why;  // when count is 0: the CUDA runtime's reason (no driver, no device, ...)
  std::string name; // device 0's name, and its compute capability as "major.minor"
  std::string capability;
};

// Asks the CUDA runtime; never throws.
DeviceStatus device_status();

// Runs a kernel built for this library's architectures on device 0 and checks what it wrote:
// n = 1000003 elements of out[i] = 2 i + 1. Returns "" on success, else what went wrong.
std::string smoke_test();

}  // namespace gcomp::cuda
