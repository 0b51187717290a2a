// Where the Python module's CUDA arrays go. The module is built against one of three:
//   * device_cuda.cpp: gcomp_cuda's backend (a build where nvcc was found);
//   * device_none.cpp: none (a build without CUDA): a CUDA array is a clear TypeError;
//   * standin_device.cpp: the host-memory stand-in (tests/standin/standin_device.hpp), for the
//     test-only build of the module (build/python_standin), so that the binding's device path
//     (argument checks, lifetimes, DLPack, streams) runs in CTest on machines without a GPU.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "device_backend.hpp"

namespace gcomp::python {

class Devices {
 public:
  virtual ~Devices() = default;
  // "cuda", "none" or "standin".
  virtual const char* name() const = 0;
  // "" when CUDA arrays can be used in this process, else why not (no CUDA in this build, no
  // usable GPU and the CUDA runtime's reason).
  virtual std::string unusable() const = 0;
  virtual const detail::DeviceBackend* backend() const = 0;
  // Whether this build has a device backend at all (not device_none.cpp's).
  bool built() const { return backend() != nullptr; }
  // The CUDA device the memory at p belongs to; -1 when p is not device memory.
  virtual int device_of(const void* p) const = 0;
  virtual int current_device() const = 0;
  virtual void set_device(int device) const = 0;
  // Work queued on `stream` from now on runs after what is already queued on `producer` (an
  // event recorded there, waited for here; no host wait).
  virtual void order_after(void* stream, void* producer) const = 0;
  // What this build adds to the module (the stand-in's test helpers, as _gcomp.standin).
  virtual void bind(pybind11::module_& m) const { (void)m; }
};

// The one of this build.
const Devices& devices();

// Makes `device` the current CUDA device for its scope (when it is not already) and puts the
// old one back after, as torch.cuda.device(...) does; -1 (host memory) does nothing.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (device < 0) return;
    const int current = devices().current_device();
    if (current == device) return;
    devices().set_device(device);
    old_ = current;
  }
  ~DeviceScope() {
    if (old_ >= 0) devices().set_device(old_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int old_ = -1;
};

}  // namespace gcomp::python
