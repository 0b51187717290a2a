// A build of the Python module without CUDA (nvcc was not found, or GCOMP_WITH_CUDA=OFF): a CUDA
// array is refused with the reason (python/device.hpp).
#include "device.hpp"

namespace gcomp::python {
namespace {

class NoDevices final : public Devices {
 public:
  const char* name() const override { return "none"; }
  std::string unusable() const override {
    return "this gcomp was built without CUDA (no nvcc at build time, or GCOMP_WITH_CUDA=OFF)";
  }
  const detail::DeviceBackend* backend() const override { return nullptr; }
  int device_of(const void*) const override { return -1; }
  int current_device() const override { return -1; }
  void set_device(int) const override {}
  void order_after(void*, void*) const override {}
};

}  // namespace

const Devices& devices() {
  static const NoDevices d;
  return d;
}

}  // namespace gcomp::python
