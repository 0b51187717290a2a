// The test-only build of the Python module (build/python_standin): its "CUDA" memory is host
// memory kept by the stand-in backend of tests/standin/standin_device.hpp, which runs the CPU
// codecs, so that the binding's whole device path (DLPack and __cuda_array_interface__ in and
// out, streams, devices, lifetimes, device residuals, the collectives on device tensors) runs in
// CTest on any machine. Its helpers, for the tests only, are the submodule _gcomp.standin.
#include "standin/standin_device.hpp"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <mutex>
#include <utility>
#include <vector>

#include "arrays.hpp"
#include "device.hpp"

namespace gcomp::python {
namespace {

namespace py = pybind11;

class StandinDevices final : public Devices {
 public:
  const char* name() const override { return "standin"; }
  std::string unusable() const override { return unusable_; }
  const detail::DeviceBackend* backend() const override { return &device_; }
  int device_of(const void* p) const override { return device_.device_of(p); }
  int current_device() const override { return device_.current_device; }
  void set_device(int device) const override {
    ++switches_;
    device_.current_device = device;
  }
  void order_after(void* stream, void* producer) const override {
    const std::lock_guard<std::mutex> lock(mutex_);
    orders_.emplace_back(reinterpret_cast<std::uintptr_t>(stream),
                         reinterpret_cast<std::uintptr_t>(producer));
  }
  void bind(py::module_& m) const override;

 private:
  // Never destroyed: DeviceArrays and residuals may outlive the module's teardown.
  test::StandinDevice& device_ = *new test::StandinDevice;
  mutable std::string unusable_;
  mutable int switches_ = 0;
  mutable std::mutex mutex_;
  mutable std::vector<std::pair<std::uintptr_t, std::uintptr_t>> orders_;
};

const StandinDevices& standin() {
  static const StandinDevices* d = new StandinDevices;
  return *d;
}

// The stand-in memory an array shows (a DeviceArray, or anything with a CUDA array interface
// into stand-in memory), as a writable numpy view that keeps the array alive.
py::array host_view(py::object array) {
  void* data = nullptr;
  std::size_t n = 0;
  bool floats = true;
  if (is_device_array(array)) {
    const DeviceArray& a = device_array_of(array);
    data = a.data;
    n = a.size;
    floats = a.elem == Elem::float32;
  } else {
    const py::dict cai = array.attr("__cuda_array_interface__");
    data = reinterpret_cast<void*>(py::cast<std::uintptr_t>(py::tuple(cai["data"])[0]));
    n = py::cast<std::size_t>(py::tuple(cai["shape"])[0]);
    floats = py::str(cai["typestr"]).cast<std::string>() == "<f4";
  }
  if (n && standin().device_of(data) < 0) {
    throw py::value_error("standin.host: the array is not in the stand-in's memory");
  }
  if (floats) {
    return py::array(py::dtype::of<float>(), {n}, {sizeof(float)}, static_cast<float*>(data),
                     array);
  }
  return py::array(py::dtype::of<std::uint8_t>(), {n}, {std::size_t{1}},
                   static_cast<std::uint8_t*>(data), array);
}

}  // namespace

void StandinDevices::bind(py::module_& m) const {
  py::module_ s = m.def_submodule(
      "standin",
      "Test helpers of the stand-in build (never in a real build): its \"CUDA\" memory is host\n"
      "memory the stand-in keeps, and its kernels are the CPU codecs.");
  s.def(
      "empty",
      [](std::size_t n, const std::string& dtype, int device) {
        if (dtype != "float32" && dtype != "uint8") {
          throw py::value_error("dtype must be \"float32\" or \"uint8\", not " + dtype);
        }
        const DeviceScope scope(device);
        py::object a = new_device_array(n, dtype == "float32" ? Elem::float32 : Elem::byte, device);
        if (n) std::memset(device_array_of(a).data, 0, device_array_of(a).nbytes());
        return a;
      },
      py::arg("n"), py::arg("dtype") = "float32", py::arg("device") = 0,
      "empty(n, dtype=\"float32\", device=0) -> gcomp.DeviceArray of zeros in stand-in memory.");
  s.def("host", &host_view, py::arg("array"),
        "host(array) -> numpy.ndarray: a writable view of an array in stand-in memory.");
  s.def(
      "adopt",
      [](std::uintptr_t p, std::size_t bytes, int device) {
        standin().device_.adopt(reinterpret_cast<void*>(p), bytes, device);
      },
      py::arg("ptr"), py::arg("nbytes"), py::arg("device") = 0,
      "adopt(ptr, nbytes, device=0): host memory at ptr counts as that device's memory.");
  s.def(
      "forget", [](std::uintptr_t p) { standin().device_.forget(reinterpret_cast<void*>(p)); },
      py::arg("ptr"), "forget(ptr): what adopt(ptr, ...) made device memory is host memory again.");
  s.def(
      "counters",
      [] {
        const StandinDevices& d = standin();
        py::dict c;
        c["copied"] = d.device_.copied;
        c["encodes"] = d.device_.encodes;
        c["decodes"] = d.device_.decodes;
        c["syncs"] = d.device_.syncs;
        std::vector<std::uintptr_t> streams;
        for (void* p : d.device_.streams) streams.push_back(reinterpret_cast<std::uintptr_t>(p));
        c["streams"] = streams;
        py::dict adam;
        const char* ops[] = {"step", "local_momentum", "frozen_update", "sync_momentum",
                             "sync_update"};
        for (std::size_t op = 0; op < 5; ++op) adam[ops[op]] = d.device_.adams.at(op);
        c["adam"] = adam;
        std::vector<std::uintptr_t> adam_streams;
        for (void* p : d.device_.adam_streams) {
          adam_streams.push_back(reinterpret_cast<std::uintptr_t>(p));
        }
        c["adam_streams"] = adam_streams;
        c["current_device"] = d.device_.current_device;
        c["switches"] = d.switches_;
        const std::lock_guard<std::mutex> lock(d.mutex_);
        c["orders"] = d.orders_;
        return c;
      },
      "counters() -> dict: bytes copied between stand-in and host memory, encodes, decodes,\n"
      "syncs, the streams calls were queued on, the current device, device switches, the\n"
      "(stream, producer) orderings asked for, Adam's calls by function (\"adam\") and their\n"
      "streams (\"adam_streams\").");
  s.def(
      "reset",
      [] {
        const StandinDevices& d = standin();
        d.device_.copied = 0;
        d.device_.encodes = d.device_.decodes = d.device_.syncs = 0;
        d.device_.streams.clear();
        d.device_.adams = {};
        d.device_.adam_streams.clear();
        d.switches_ = 0;
        const std::lock_guard<std::mutex> lock(d.mutex_);
        d.orders_.clear();
      },
      "reset(): the counters to zero.");
  s.def(
      "set_unusable", [](const std::string& why) { standin().unusable_ = why; }, py::arg("why"),
      "set_unusable(why): act as a machine without a usable GPU (\"\": usable again).");
}

const Devices& devices() { return standin(); }

}  // namespace gcomp::python
