// The CUDA backend's tests. They are always built when nvcc is found and skip, saying why, on a
// machine without a usable GPU (scripts/gpu-check runs them where there is one).
#include <gtest/gtest.h>

#include "gcomp/cuda.hpp"

namespace {

TEST(CudaRuntime, KernelRunsOnTheDevice) {
  const gcomp::cuda::DeviceStatus s = gcomp::cuda::device_status();
  if (s.count == 0) GTEST_SKIP() << "no usable CUDA device: " << s.why;
  EXPECT_FALSE(s.name.empty());
  EXPECT_FALSE(s.capability.empty());
  EXPECT_EQ(gcomp::cuda::smoke_test(), "") << s.name << " (" << s.capability << ")";
}

TEST(CudaRuntime, NoDeviceIsReportedNotThrown) {
  const gcomp::cuda::DeviceStatus s = gcomp::cuda::device_status();
  if (s.count > 0) GTEST_SKIP() << "a device is present: " << s.name;
  EXPECT_FALSE(s.why.empty());
  EXPECT_NE(gcomp::cuda::smoke_test().find("no CUDA device"), std::string::npos);
}

}  // namespace
