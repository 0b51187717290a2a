// gcomp.ErrorFeedback: the error-feedback memory of one tensor, in host memory or on a CUDA
// device, and the check that a call's residual fits its tensor.
#include <pybind11/numpy.h>

#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "binding.hpp"
#include "feedback_slot.hpp"

namespace gcomp::python {

namespace {

std::string memory_name(int device) {
  return device < 0 ? "host memory" : "CUDA device " + std::to_string(device);
}

}  // namespace

PyErrorFeedback* to_ef(py::handle ef, const Held& tensor, const std::string& what) {
  if (ef.is_none()) return nullptr;
  if (!py::isinstance<PyErrorFeedback>(ef)) {
    throw py::type_error(what + " must be a gcomp.ErrorFeedback or None, not " + type_name(ef));
  }
  PyErrorFeedback* e = ef.cast<PyErrorFeedback*>();
  if (e->ef.size() != tensor.size()) {
    throw py::value_error(what + " holds " + std::to_string(e->ef.size()) +
                          " elements; its tensor has " + std::to_string(tensor.size()));
  }
  if (e->device != tensor.device()) {
    throw py::value_error(what + " is in " + memory_name(e->device) + " but " + tensor.what() +
                          " is in " + memory_name(tensor.device()) +
                          ": make it with gcomp.ErrorFeedback(n, device=...) where its tensor is");
  }
  return e;
}

namespace {

// "cuda", "cuda:N", an int N, a torch.device, None or "cpu": the device (-1: host memory).
int to_device(py::handle device) {
  if (device.is_none()) return -1;
  if (PyIndex_Check(device.ptr()) && !py::isinstance<py::bool_>(device)) {
    const int d = device.cast<int>();
    if (d < 0)
      throw py::value_error("device must be a CUDA device number >= 0, not " + std::to_string(d));
    return d;
  }
  const std::string text = py::str(device);  // torch.device("cuda:1") prints as "cuda:1"
  if (text == "cpu") return -1;
  if (text == "cuda") return -2;  // the current device
  if (text.rfind("cuda:", 0) == 0 && text.size() > 5 &&
      text.find_first_not_of("0123456789", 5) == std::string::npos && text.size() < 12) {
    return std::stoi(text.substr(5));
  }
  throw py::value_error(
      "device must be None, \"cpu\", \"cuda\", \"cuda:N\", an int or a "
      "torch.device, not " +
      std::string(py::repr(device)));
}

std::unique_ptr<PyErrorFeedback> make_ef(std::size_t n, py::handle device) {
  int d = to_device(device);
  if (d == -1) return std::make_unique<PyErrorFeedback>(n);
  if (const std::string why = devices().unusable(); !why.empty()) {
    const std::string text = "ErrorFeedback(device=" + std::string(py::repr(device)) + "): " + why;
    if (!devices().built()) throw py::type_error(text);
    throw py::value_error(text);
  }
  if (d == -2) d = devices().current_device();
  const DeviceScope scope(d);
  return std::make_unique<PyErrorFeedback>(n, d);
}

}  // namespace

void bind_feedback(py::module_& m) {
  py::class_<PyErrorFeedback>(m, "ErrorFeedback",
                              "ErrorFeedback(n): the error-feedback memory (residual) of one\n"
                              "tensor of n floats, zeros at first. Use one per tensor, with one\n"
                              "thread at a time.")
      .def(py::init(&make_ef), py::arg("n"), py::arg("device") = py::none(),
           "ErrorFeedback(n, device=None)\n\n"
           "device: None or \"cpu\" (host memory), or a CUDA device (\"cuda\", \"cuda:N\", N,\n"
           "a torch.device) for the tensors there.")
      .def_property_readonly(
          "device",
          [](const PyErrorFeedback& e) {
            return e.device < 0 ? std::string("cpu") : "cuda:" + std::to_string(e.device);
          },
          "Where its memory is: \"cpu\" or \"cuda:N\".")
      .def_property_readonly(
          "size", [](const PyErrorFeedback& e) { return e.ef.size(); }, "The number of elements.")
      .def(
          "__len__", [](const PyErrorFeedback& e) { return e.ef.size(); }, "len(ef): its size")
      .def_property_readonly(
          "residual",
          [](py::object self) {
            PyErrorFeedback& e = self.cast<PyErrorFeedback&>();
            if (e.device >= 0) {
              return gcomp::python::device_array_view(e.ef.view().data(), e.ef.size(),
                                                      Elem::float32, e.device, self);
            }
            const std::span<float> r = e.ef.residual();
            return py::object(
                py::array(py::dtype::of<float>(), {r.size()}, {sizeof(float)}, r.data(), self));
          },
          "The current residual: a float32 numpy view of it (no copy; writing to it changes it);\n"
          "on a device, a gcomp.DeviceArray of it (torch.from_dlpack takes it, no copy).\n"
          "Each encode writes the new residual to the other of two buffers, so take\n"
          "ef.residual again after an encode; an older view then shows a buffer the library\n"
          "reuses (it stays valid memory as long as the view lives).")
      .def_property(
          "kept",
          [](const PyErrorFeedback& e) {
            const std::vector<float>& k = gcomp::detail::FeedbackSlot::of(e.ef);
            py::array_t<float> out(static_cast<py::ssize_t>(k.size()));
            if (!k.empty()) std::memcpy(out.mutable_data(), k.data(), k.size() * sizeof(float));
            return out;
          },
          [](PyErrorFeedback& e, py::handle values) {
            const Held in(values, "kept", Elem::float32, false);
            const Using using_ef(&e);
            const std::span<const float> v = in.floats();
            gcomp::detail::FeedbackSlot::of(e.ef).assign(v.begin(), v.end());
          },
          "What the collectives keep beside the residual (the low_rank algorithm's warm-start\n"
          "factor, compressed_reduce_scatter's owner-side residual; empty until an algorithm\n"
          "keeps something): a float32 copy. Assigning a float32 array sets it, as a checkpoint\n"
          "restores it (gcomp.torch's state_dict); the algorithm checks what it finds and starts\n"
          "afresh where it does not fit.")
      .def(
          "reset", [](PyErrorFeedback& e) { e.ef.reset(); },
          "reset()\n\nSets the residual to zero.")
      .def("__repr__", [](const PyErrorFeedback& e) {
        if (e.device >= 0) {
          return "gcomp.ErrorFeedback(" + std::to_string(e.ef.size()) +
                 ", device=\"cuda:" + std::to_string(e.device) + "\")";
        }
        return "gcomp.ErrorFeedback(" + std::to_string(e.ef.size()) + ")";
      });
}

}  // namespace gcomp::python
