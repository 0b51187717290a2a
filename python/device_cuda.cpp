// The Python module's CUDA arrays on gcomp_cuda's backend (python/device.hpp).
#include "device.hpp"
#include "gcomp/cuda.hpp"

namespace gcomp::python {
namespace {

class CudaDevices final : public Devices {
 public:
  const char* name() const override { return "cuda"; }
  std::string unusable() const override {
    const cuda::DeviceStatus s = cuda::device_status();
    return s.count > 0 ? std::string() : "no usable GPU: " + s.why;
  }
  const detail::DeviceBackend* backend() const override {
    return cuda::view(static_cast<const float*>(nullptr), 0).backend();
  }
  int device_of(const void* p) const override { return cuda::device_of(p); }
  int current_device() const override { return cuda::current_device(); }
  void set_device(int device) const override { cuda::set_device(device); }
  void order_after(void* stream, void* producer) const override {
    cuda::order_after(stream, producer);
  }
};

}  // namespace

const Devices& devices() {
  static const CudaDevices d;
  return d;
}

}  // namespace gcomp::python
