// The module's arrays in place, in host or device memory (python/arrays.hpp).
#include "arrays.hpp"

#include <dlpack/dlpack.h>
#include <pybind11/numpy.h>

#include <cstdint>
#include <cstring>
#include <utility>

#include "device.hpp"
#include "gcomp/error.hpp"

namespace gcomp::python {

const char* needed(Elem e) {
  return e == Elem::float32 ? "a 1-D float32 numpy array or torch tensor"
                            : "a 1-D uint8 numpy array (or bytes, bytearray, a uint8 torch "
                              "tensor)";
}

std::string type_name(py::handle obj) { return Py_TYPE(obj.ptr())->tp_name; }

std::uint64_t to_uint64(py::handle v, const std::string& what, const std::string& wanted) {
  const py::int_ i = py::reinterpret_steal<py::int_>(PyNumber_Index(v.ptr()));
  if (!i) {
    PyErr_Clear();
    throw py::type_error(what + " must be " + wanted + ", not " + type_name(v));
  }
  const unsigned long long u = PyLong_AsUnsignedLongLong(i.ptr());
  if (u == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();
    throw py::value_error(what + " must be " + wanted + ", not " + std::string(py::str(v)));
  }
  return u;
}

bool is_torch_tensor(py::handle obj) {
  PyObject* torch = PyDict_GetItemString(PyImport_GetModuleDict(), "torch");  // borrowed
  if (torch == nullptr) return false;
  py::object tensor = py::reinterpret_borrow<py::object>(torch).attr("Tensor");
  return PyObject_IsInstance(obj.ptr(), tensor.ptr()) == 1;
}

namespace {

std::size_t item_bytes(Elem e) { return e == Elem::float32 ? 4 : 1; }

// An address or a handle, as an int.
void* to_address(py::handle v, const std::string& what) {
  return reinterpret_cast<void*>(
      static_cast<std::uintptr_t>(to_uint64(v, what, "an address (a non-negative int)")));
}

// Where an object's memory is, as far as the protocols say.
enum class Source { host, torch_cpu, dlpack, interface };

Source source_of(py::handle obj, const std::string& what) {
  if (PyObject_CheckBuffer(obj.ptr())) return Source::host;  // numpy, bytes, memoryview
  // A torch tensor says where it is through is_cuda, a C attribute; its __dlpack_device__ is
  // Python code that costs a CPU tensor's call more than the binding's own work on a small one.
  if (is_torch_tensor(obj) && !obj.attr("is_cuda").cast<bool>()) return Source::torch_cpu;
  if (py::hasattr(obj, "__dlpack_device__")) {
    const py::tuple dev =
        py::reinterpret_steal<py::tuple>(PySequence_Tuple(obj.attr("__dlpack_device__")().ptr()));
    if (!dev || dev.size() != 2) {
      PyErr_Clear();
      throw py::type_error(what + ".__dlpack_device__() is not a (type, id) pair");
    }
    const int type = dev[0].cast<int>();
    if (type == kDLCPU || type == kDLCUDAHost) return Source::host;  // through the buffer protocol
    if (type == kDLCUDA || type == kDLCUDAManaged) {
      return py::hasattr(obj, "__dlpack__") ? Source::dlpack : Source::interface;
    }
    throw py::type_error(what + " is on DLPack device type " + std::to_string(type) +
                         "; gcomp takes host memory and CUDA devices");
  }
  if (py::hasattr(obj, "__cuda_array_interface__")) return Source::interface;
  return Source::host;  // the buffer path says what is wrong with it
}

// The DLPack stream value for a call's stream: 1 for the legacy default stream (DLPack's
// convention; 0 is not allowed), else the handle.
py::int_ dlpack_stream(void* handle) {
  return py::int_(handle ? reinterpret_cast<std::intptr_t>(handle) : 1);
}

void check_usable(const std::string& what) {
  const std::string why = devices().unusable();
  if (why.empty()) return;
  const std::string text = what + " is a CUDA array, but " + why;
  if (!devices().built()) throw py::type_error(text);
  throw py::value_error(text);
}

}  // namespace

CallStream to_stream(py::handle stream) {
  CallStream s;
  if (stream.is_none()) return s;
  py::handle value = stream;
  py::object attr;
  if (!PyIndex_Check(stream.ptr()) && py::hasattr(stream, "cuda_stream")) {
    attr = stream.attr("cuda_stream");
    value = attr;
  }
  if (!PyIndex_Check(value.ptr())) {
    throw py::type_error(
        "stream must be a CUDA stream handle (an int, or a torch.cuda.Stream), "
        "not " +
        type_name(stream));
  }
  s.handle = reinterpret_cast<void*>(static_cast<std::uintptr_t>(
      to_uint64(value, "stream", "a CUDA stream handle (a non-negative int)")));
  s.given = true;
  return s;
}

Held::Held(py::handle obj, std::string what, Elem elem, bool writable, const CallStream* stream)
    : what_(std::move(what)) {
  const Source source = source_of(obj, what_);
  if (source == Source::host || source == Source::torch_cpu) {
    take_buffer(obj, elem, writable, source == Source::torch_cpu);
    return;
  }
  if (stream == nullptr) {
    throw py::type_error(what_ + " is a CUDA array; this call takes host memory: " + needed(elem));
  }
  check_usable(what_);
  stream_ = stream->handle;
  if (source == Source::dlpack) {
    take_dlpack(obj, elem, *stream);
  } else {
    take_interface(obj, elem, writable, *stream);
  }
  if (reinterpret_cast<std::uintptr_t>(data_) % item_bytes(elem) != 0) {
    throw py::value_error(what_ + " is not aligned to its element size");
  }
}

Held::~Held() = default;

Held::Export::~Export() {
  if (managed && managed->deleter) managed->deleter(managed);
}

std::span<float> Held::floats() const {
  if (on_device()) throw Error(Status::invalid_argument, what_ + " is a CUDA array");
  return {static_cast<float*>(data_), size_};
}

std::span<std::byte> Held::bytes() const {
  if (on_device()) throw Error(Status::invalid_argument, what_ + " is a CUDA array");
  return {static_cast<std::byte*>(data_), size_};
}

TensorView<float> Held::float_view() const {
  if (!on_device()) return floats();
  return TensorView<float>::device(static_cast<float*>(data_), size_, stream_, devices().backend());
}

TensorView<std::byte> Held::byte_view() const {
  if (!on_device()) return bytes();
  return TensorView<std::byte>::device(static_cast<std::byte*>(data_), size_, stream_,
                                       devices().backend());
}

// ---- host memory: the buffer protocol ----

namespace {

py::object torch_view(py::handle t, const std::string& what, Elem elem, bool writable) {
  const std::string dtype = py::str(t.attr("dtype"));
  const char* want = elem == Elem::float32 ? "torch.float32" : "torch.uint8";
  if (dtype != want) {
    throw py::type_error(what + " has dtype " + dtype + "; " + needed(elem) + " is needed");
  }
  const py::tuple shape = py::reinterpret_steal<py::tuple>(PySequence_Tuple(t.attr("shape").ptr()));
  if (!shape) throw py::error_already_set();
  if (shape.size() != 1) {
    throw py::value_error(what + " has shape " + std::string(py::repr(shape)) + "; " +
                          needed(elem) + " is needed");
  }
  if (!t.attr("is_contiguous")().cast<bool>()) {
    throw py::value_error(what + " is not contiguous (stride " +
                          std::string(py::str(t.attr("stride")())) + "); " + needed(elem) +
                          " is needed (.contiguous() makes one)");
  }
  if (!t.attr("requires_grad").cast<bool>()) return t.attr("numpy")();
  if (writable) {
    throw py::value_error(what +
                          " requires grad and would be written in place; pass a "
                          "tensor that does not (a .grad, or .detach())");
  }
  return t.attr("detach")().attr("numpy")();
}

}  // namespace

void Held::take_buffer(py::handle obj, Elem elem, bool writable, bool torch_cpu) {
  py::handle source = obj;
  if (torch_cpu) {
    numpy_view_ = torch_view(obj, what_, elem, writable);
    source = numpy_view_;
  } else if (!PyObject_CheckBuffer(obj.ptr())) {
    throw py::type_error(what_ + " must be " + needed(elem) + ", not " + type_name(obj));
  }
  if (PyObject_GetBuffer(source.ptr(), &buffer_.view, PyBUF_RECORDS_RO) != 0) {
    throw py::error_already_set();
  }
  buffer_.held = true;
  check_host(obj, elem, writable);
  data_ = view_.buf;
  size_ = static_cast<std::size_t>(view_.shape[0]);
}

void Held::check_host(py::handle obj, Elem elem, bool writable) const {
  std::string format = view_.format ? view_.format : "B";
  if (!format.empty() && (format[0] == '@' || format[0] == '=' || format[0] == '<')) {
    format.erase(0, 1);
  }
  const bool ok = elem == Elem::float32
                      ? format == "f" && view_.itemsize == 4
                      : (format == "B" || format == "b" || format == "c") && view_.itemsize == 1;
  if (!ok) {
    std::string dtype = "buffer format '" + std::string(view_.format ? view_.format : "B") + "'";
    if (py::hasattr(obj, "dtype")) dtype = py::str(obj.attr("dtype"));
    throw py::type_error(what_ + " has dtype " + dtype + "; " + needed(elem) + " is needed");
  }
  if (view_.ndim != 1) {
    std::string shape = "(";
    for (int d = 0; d < view_.ndim; ++d) shape += (d ? ", " : "") + std::to_string(view_.shape[d]);
    shape += view_.ndim == 1 ? ",)" : ")";
    throw py::value_error(what_ + " has shape " + shape + "; " + needed(elem) + " is needed");
  }
  if (view_.shape[0] > 1 && view_.strides[0] != view_.itemsize) {
    throw py::value_error(what_ + " is not contiguous (stride " + std::to_string(view_.strides[0]) +
                          " bytes); " + needed(elem) +
                          " is needed (numpy.ascontiguousarray makes one)");
  }
  if (reinterpret_cast<std::uintptr_t>(view_.buf) % view_.itemsize != 0) {
    throw py::value_error(what_ + " is not aligned to its element size");
  }
  if (writable && view_.readonly) {
    throw py::value_error(what_ + " is read-only; it is written in place");
  }
}

// ---- device memory: DLPack ----

void Held::take_dlpack(py::handle obj, Elem elem, const CallStream& stream) {
  py::object capsule;
  try {
    // The producer orders its pending work on the array before the call's stream (DLPack).
    capsule = obj.attr("__dlpack__")(py::arg("stream") = dlpack_stream(stream.handle));
  } catch (py::error_already_set& e) {
    throw py::value_error(what_ + ": its __dlpack__ failed: " + std::string(e.what()));
  }
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  if (m == nullptr) {
    PyErr_Clear();
    throw py::type_error(what_ + ".__dlpack__() did not return an unused \"dltensor\" capsule");
  }
  // Ours now: the capsule must not release it too.
  if (PyCapsule_SetName(capsule.ptr(), "used_dltensor") != 0) throw py::error_already_set();
  export_.managed = m;
  const DLTensor& t = m->dl_tensor;
  const DLDataType want =
      elem == Elem::float32 ? DLDataType{kDLFloat, 32, 1} : DLDataType{kDLUInt, 8, 1};
  const bool int8 = elem == Elem::byte && t.dtype.code == kDLInt && t.dtype.bits == 8;
  if (!int8 &&
      (t.dtype.code != want.code || t.dtype.bits != want.bits || t.dtype.lanes != want.lanes)) {
    throw py::type_error(what_ + " has DLPack dtype (code " + std::to_string(t.dtype.code) +
                         ", bits " + std::to_string(t.dtype.bits) + ", lanes " +
                         std::to_string(t.dtype.lanes) + "); " + needed(elem) + " is needed");
  }
  if (t.ndim != 1) {
    throw py::value_error(what_ + " has " + std::to_string(t.ndim) + " dimensions; " +
                          needed(elem) + " is needed");
  }
  if (t.shape[0] > 1 && t.strides != nullptr && t.strides[0] != 1) {
    throw py::value_error(what_ + " is not contiguous (stride " + std::to_string(t.strides[0]) +
                          " elements); " + needed(elem) + " is needed (.contiguous() makes one)");
  }
  data_ = static_cast<char*>(t.data) + t.byte_offset;
  size_ = static_cast<std::size_t>(t.shape[0]);
  device_ = t.device.device_id;
}

// ---- device memory: __cuda_array_interface__ ----

void Held::take_interface(py::handle obj, Elem elem, bool writable, const CallStream& stream) {
  py::object got;
  try {
    got = obj.attr("__cuda_array_interface__");
  } catch (py::error_already_set& e) {
    throw py::value_error(what_ +
                          ": its __cuda_array_interface__ failed: " + std::string(e.what()));
  }
  if (!py::isinstance<py::dict>(got)) {
    throw py::type_error(what_ + ".__cuda_array_interface__ is not a dict");
  }
  const py::dict cai = got;
  const auto item = [&](const char* key) -> py::object {
    if (!cai.contains(key)) return py::none();
    return cai[key];
  };
  const std::string typestr = py::str(item("typestr"));
  const bool ok = elem == Elem::float32 ? typestr == "<f4"
                                        : typestr == "|u1" || typestr == "<u1" ||
                                              typestr == "|i1" || typestr == "<i1";
  if (!ok) {
    throw py::type_error(what_ + " has typestr '" + typestr + "'; " + needed(elem) + " is needed");
  }
  const py::object shape_obj = item("shape");
  if (!py::isinstance<py::tuple>(shape_obj) || py::len(shape_obj) != 1) {
    throw py::value_error(what_ + " has shape " + std::string(py::repr(shape_obj)) + "; " +
                          needed(elem) + " is needed");
  }
  const std::size_t n = py::cast<std::size_t>(py::tuple(shape_obj)[0]);
  const py::object strides = item("strides");
  if (!strides.is_none() && n > 1 &&
      py::cast<std::size_t>(py::tuple(strides)[0]) != item_bytes(elem)) {
    throw py::value_error(what_ + " is not contiguous (strides " + std::string(py::repr(strides)) +
                          "); " + needed(elem) + " is needed");
  }
  if (!item("mask").is_none()) throw py::value_error(what_ + " has a mask; gcomp takes none");
  const py::object data_obj = item("data");
  if (!py::isinstance<py::tuple>(data_obj) || py::len(data_obj) != 2) {
    throw py::type_error(what_ + ".__cuda_array_interface__['data'] is not (pointer, readonly)");
  }
  const py::tuple data = data_obj;
  if (writable && py::cast<bool>(data[1])) {
    throw py::value_error(what_ + " is read-only; it is written in place");
  }
  data_ = to_address(data[0], what_ + "'s data pointer");
  size_ = n;
  device_ = data_ ? devices().device_of(data_) : devices().current_device();
  if (device_ < 0) {
    throw py::value_error(what_ +
                          " gives a __cuda_array_interface__ whose pointer is not in "
                          "CUDA device memory");
  }
  // Version 3's stream: the producer's work on the array is ordered before the call's stream.
  const py::object producer = item("stream");
  if (!producer.is_none()) {
    void* const p = to_address(producer, what_ + "'s __cuda_array_interface__ stream");
    if (p == nullptr) {
      throw py::value_error(what_ +
                            "'s __cuda_array_interface__ stream is 0, which the "
                            "protocol does not allow");
    }
    devices().order_after(stream.handle, reinterpret_cast<void*>(p));
  }
}

int same_memory(const std::vector<const Held*>& arrays, const CallStream& stream) {
  const Held* first = nullptr;
  for (const Held* a : arrays) {
    if (a == nullptr) continue;
    if (first == nullptr) {
      first = a;
      continue;
    }
    if (a->device() == first->device()) continue;
    const auto where = [](const Held* h) {
      return h->on_device() ? "on CUDA device " + std::to_string(h->device()) : "in host memory";
    };
    throw py::value_error(first->what() + " is " + where(first) + " but " + a->what() + " is " +
                          where(a) + ": pass every array of a call in one memory");
  }
  const int device = first ? first->device() : -1;
  if (stream.given && device < 0) {
    throw py::value_error("stream= is for CUDA arrays; this call's arrays are in host memory");
  }
  return device;
}

// ---- gcomp.DeviceArray ----

namespace {

// A DLPack export of a DeviceArray: holds a reference to it until the consumer is done.
struct Export {
  DLManagedTensor managed{};
  std::int64_t shape = 0;
  PyObject* owner = nullptr;
};

void release_export(DLManagedTensor* m) {
  auto* e = static_cast<Export*>(m->manager_ctx);
  const PyGILState_STATE gil = PyGILState_Ensure();  // consumers may release from any thread
  Py_XDECREF(e->owner);
  PyGILState_Release(gil);
  delete e;
}

void release_unused_capsule(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, "dltensor")) return;  // consumed: the consumer releases it
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  if (m && m->deleter) m->deleter(m);
}

py::object export_dlpack(py::object self, py::object stream) {
  const DeviceArray& a = self.cast<const DeviceArray&>();
  if (!stream.is_none()) (void)to_address(stream, "stream");  // complete when handed out: no wait
  auto* e = new Export;
  e->shape = static_cast<std::int64_t>(a.size);
  DLTensor& t = e->managed.dl_tensor;
  t.data = a.data;
  t.device = DLDevice{kDLCUDA, a.device};
  t.ndim = 1;
  t.dtype = a.elem == Elem::float32 ? DLDataType{kDLFloat, 32, 1} : DLDataType{kDLUInt, 8, 1};
  t.shape = &e->shape;
  t.strides = nullptr;  // compact
  t.byte_offset = 0;
  e->managed.manager_ctx = e;
  e->managed.deleter = &release_export;
  e->owner = self.inc_ref().ptr();
  PyObject* capsule = PyCapsule_New(&e->managed, "dltensor", &release_unused_capsule);
  if (capsule == nullptr) {
    release_export(&e->managed);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(capsule);
}

py::dict interface_of(const DeviceArray& a) {
  py::dict d;
  d["shape"] = py::make_tuple(a.size);
  d["typestr"] = a.elem == Elem::float32 ? "<f4" : "|u1";
  d["data"] = py::make_tuple(reinterpret_cast<std::uintptr_t>(a.data), false);
  d["version"] = 3;
  d["strides"] = py::none();
  d["stream"] = py::none();  // complete when handed out: nothing to wait for
  return d;
}

py::object to_numpy(const DeviceArray& a) {
  py::array out = a.elem == Elem::float32
                      ? py::array(py::array_t<float>(static_cast<py::ssize_t>(a.size)))
                      : py::array(py::array_t<std::uint8_t>(static_cast<py::ssize_t>(a.size)));
  if (a.size) {
    const DeviceScope scope(a.device);
    py::gil_scoped_release nogil;
    devices().backend()->copy(out.mutable_data(), a.data, a.nbytes(), nullptr);
  }
  return out;
}

}  // namespace

py::object new_device_array(std::size_t n, Elem elem, int device) {
  const detail::DeviceBackend* backend = devices().backend();
  DeviceArray a;
  a.size = n;
  a.elem = elem;
  a.device = device;
  if (n) {
    void* p = backend->alloc(a.nbytes());
    a.memory = std::shared_ptr<void>(p, [backend, device](void* q) {
      const DeviceScope scope(device);
      backend->free(q);
    });
    a.data = p;
  }
  return py::cast(std::move(a));
}

py::object device_array_view(void* data, std::size_t n, Elem elem, int device, py::object keep) {
  DeviceArray a;
  a.data = data;
  a.size = n;
  a.elem = elem;
  a.device = device;
  a.keep = std::move(keep);
  return py::cast(std::move(a));
}

bool is_device_array(py::handle obj) { return py::isinstance<DeviceArray>(obj); }

DeviceArray& device_array_of(py::handle obj) { return obj.cast<DeviceArray&>(); }

void bind_arrays(py::module_& m) {
  py::class_<DeviceArray>(
      m, "DeviceArray",
      "A 1-D array in CUDA device memory that gcomp handed out: the payload of a device\n"
      "tensor (Codec.encode), a device residual (ErrorFeedback.residual). No copies: torch\n"
      "takes it with torch.from_dlpack(a) (or torch.as_tensor(a, device=\"cuda\") through\n"
      "__cuda_array_interface__), and gcomp's calls take it back as they take any CUDA array.\n"
      "Its memory lives as long as it or any such export does. Its contents are complete when\n"
      "it is handed out. a.numpy() copies it to host memory.")
      .def("__len__", [](const DeviceArray& a) { return a.size; })
      .def_property_readonly(
          "size", [](const DeviceArray& a) { return a.size; }, "Elements.")
      .def_property_readonly("nbytes", &DeviceArray::nbytes, "Bytes.")
      .def_property_readonly(
          "dtype",
          [](const DeviceArray& a) { return a.elem == Elem::float32 ? "float32" : "uint8"; },
          "\"float32\" or \"uint8\".")
      .def_property_readonly(
          "device", [](const DeviceArray& a) { return "cuda:" + std::to_string(a.device); },
          "\"cuda:N\".")
      .def_property_readonly(
          "data_ptr", [](const DeviceArray& a) { return reinterpret_cast<std::uintptr_t>(a.data); },
          "The device address, as an int.")
      .def("__dlpack__", &export_dlpack, py::arg("stream") = py::none(),
           "DLPack export (no copy); the array is complete, so stream needs no wait.")
      .def("__dlpack_device__",
           [](const DeviceArray& a) { return py::make_tuple(static_cast<int>(kDLCUDA), a.device); })
      .def_property_readonly("__cuda_array_interface__", &interface_of,
                             "The CUDA Array Interface (version 3; no copy).")
      .def("numpy", &to_numpy, "numpy() -> numpy.ndarray: a host copy.")
      .def("__repr__", [](const DeviceArray& a) {
        return "gcomp.DeviceArray(" + std::to_string(a.size) +
               ", dtype=" + (a.elem == Elem::float32 ? "float32" : "uint8") +
               ", device=cuda:" + std::to_string(a.device) + ")";
      });
}

}  // namespace gcomp::python
