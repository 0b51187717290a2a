// gcomp._gcomp: the Python binding of gcomp's C++ API (include/gcomp/codec.hpp, communicator.hpp),
// re-exported by the package gcomp (python/gcomp/__init__.py). Reference: docs/python.md.
//
// What this file does and nothing more: it takes arrays and tensors in place, in host memory or
// on a CUDA device (python/arrays.hpp), checks that each is what the call needs (dtype, 1-D,
// contiguous, aligned, writable, size, one memory per call) and says so otherwise, releases the
// GIL around every call into the library, turns gcomp::Error into gcomp.Error, and initializes
// and finalizes MPI for the Communicator. Every computation is the C++ library's.
#include <mpi.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

// The pybind11 that CMake found (python/CMakeLists.txt) must be the one whose headers come first.
#if defined(GCOMP_PYBIND11_FOUND_MAJOR) &&                    \
    (PYBIND11_VERSION_MAJOR != GCOMP_PYBIND11_FOUND_MAJOR || \
     PYBIND11_VERSION_MINOR != GCOMP_PYBIND11_FOUND_MINOR)
#error "pybind11's headers are not the pybind11 CMake found: another include folder comes first"
#endif

#include "arrays.hpp"
#include "device.hpp"
#include "feedback_slot.hpp"
#include "gcomp/codec.hpp"
#include "gcomp/communicator.hpp"
#include "gcomp/momentum.hpp"
#include "wire.hpp"
#ifdef GCOMP_PY_HAVE_GLOO
#include <gloo/rendezvous/store.h>

#include "store.hpp"
#endif

namespace py = pybind11;

namespace {

using gcomp::Status;

// ---- errors ----

PyObject* g_error = nullptr;  // gcomp.Error, created at import and never freed

void raise_gcomp_error(Status status, const char* message) {
  PyObject* instance = PyObject_CallFunction(g_error, "s", message);
  if (instance == nullptr) return;  // the error of that call is set instead
  PyObject* name = PyUnicode_FromString(gcomp::status_name(status));
  if (name != nullptr) {
    PyObject_SetAttrString(instance, "status", name);
    Py_DECREF(name);
  }
  PyErr_SetObject(g_error, instance);
  Py_DECREF(instance);
}

using gcomp::python::CallStream;
using gcomp::python::devices;
using gcomp::python::DeviceScope;
using gcomp::python::Elem;
using gcomp::python::Held;
using gcomp::python::is_torch_tensor;
using gcomp::python::needed;
using gcomp::python::same_memory;
using gcomp::python::to_stream;
using gcomp::python::type_name;

std::uint64_t to_seed(py::handle seed, const std::string& what = "seed") {
  return gcomp::python::to_uint64(seed, what, "an int in 0..2**64-1");
}

std::size_t to_count(py::handle v, const std::string& what) {
  return static_cast<std::size_t>(gcomp::python::to_uint64(v, what, "a non-negative int"));
}

// ---- error feedback ----

// gcomp::ErrorFeedback, marked busy while a call uses it with the GIL released, so that two
// threads never run with one residual. Its memory is the host's (device -1) or a CUDA device's.
struct PyErrorFeedback {
  explicit PyErrorFeedback(std::size_t n) : ef(n) {}
  PyErrorFeedback(std::size_t n, int dev) : ef(n, devices().backend(), nullptr), device(dev) {}
  gcomp::ErrorFeedback ef;
  int device = -1;
  std::atomic<bool> busy{false};
};

class Using {
 public:
  explicit Using(PyErrorFeedback* e) : e_(e) {
    if (e_ && e_->busy.exchange(true)) {
      e_ = nullptr;
      throw gcomp::Error(Status::invalid_argument,
                         "this ErrorFeedback is in use (by another thread, or twice in one call)");
    }
  }
  ~Using() {
    if (e_) e_->busy.store(false);
  }
  Using(const Using&) = delete;
  Using& operator=(const Using&) = delete;

 private:
  PyErrorFeedback* e_;
};

std::string memory_name(int device) {
  return device < 0 ? "host memory" : "CUDA device " + std::to_string(device);
}

// The error-feedback memory of a tensor (its size and memory: host, or its device).
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

// ---- the codecs ----

// The written prefix of out: a view of the same memory (numpy arrays and torch tensors through
// their slicing, gcomp.DeviceArray and other device arrays as a DeviceArray that keeps out);
// for bytearray and other buffers a numpy view that holds an export of out, so that it cannot
// move.
py::object prefix_of(py::handle out, const Held& o, std::size_t bytes) {
  const auto prefix = py::slice(0, static_cast<py::ssize_t>(bytes), 1);
  if (is_torch_tensor(out) || py::isinstance<py::array>(out)) return out[prefix];
  if (o.on_device()) {
    return gcomp::python::device_array_view(o.byte_view().data(), bytes, Elem::byte, o.device(),
                                            py::reinterpret_borrow<py::object>(out));
  }
  return py::module_::import("numpy").attr("frombuffer")(out, "uint8", bytes);
}

std::size_t encode_into(const gcomp::Codec& codec, const Held& in, std::uint64_t seed,
                        PyErrorFeedback* e, gcomp::TensorView<std::byte> out) {
  const Using using_ef(e);
  const DeviceScope scope(in.device());
  py::gil_scoped_release nogil;
  return e ? codec.encode_ef(e->ef, in.float_view(), seed, out)
           : codec.encode(in.float_view(), seed, out);
}

py::object encode(const gcomp::Codec& codec, py::handle x, py::handle seed, py::handle ef,
                  py::handle out, py::handle stream) {
  const CallStream st = to_stream(stream);
  const Held in(x, "x", Elem::float32, false, &st);
  const std::uint64_t s = to_seed(seed);
  PyErrorFeedback* e = to_ef(ef, in, "ef");
  if (!out.is_none()) {
    const Held o(out, "out", Elem::byte, true, &st);
    same_memory({&in, &o}, st);
    const std::size_t bytes = encode_into(codec, in, s, e, o.byte_view());
    return prefix_of(out, o, bytes);
  }
  const int device = same_memory({&in}, st);
  const std::size_t max = codec.max_bytes(in.size());
  if (device >= 0) {
    // The payload in device memory of its own, handed out as a gcomp.DeviceArray.
    const DeviceScope scope(device);
    py::object payload = gcomp::python::new_device_array(max, Elem::byte, device);
    auto& a = gcomp::python::device_array_of(payload);
    const auto view = gcomp::TensorView<std::byte>::device(static_cast<std::byte*>(a.data), max,
                                                           st.handle, devices().backend());
    a.size = encode_into(codec, in, s, e, view);
    return payload;
  }
  // The payload in numpy's memory (numpy asks for huge pages from 4 MiB, as for its arrays).
  py::array_t<std::uint8_t> payload(static_cast<py::ssize_t>(max));
  const std::span<std::byte> buf(reinterpret_cast<std::byte*>(payload.mutable_data()), max);
  const std::size_t bytes = encode_into(codec, in, s, e, buf);
  if (bytes == max) return payload;
  if (bytes >= max / 2) return payload[py::slice(0, static_cast<py::ssize_t>(bytes), 1)];
  // A bound far above the payload (threshold's): keep only what was written.
  py::array_t<std::uint8_t> exact(static_cast<py::ssize_t>(bytes));
  std::memcpy(exact.mutable_data(), buf.data(), bytes);
  return exact;
}

py::object decode_add(py::handle payload, py::handle acc, double alpha, py::handle stream) {
  const CallStream st = to_stream(stream);
  const Held p(payload, "payload", Elem::byte, false, &st);
  const Held a(acc, "acc", Elem::float32, true, &st);
  const int device = same_memory({&p, &a}, st);
  if (device < 0) {
    // The element count from the header alone (decode_add validates the whole payload; on the
    // device it checks the count too, as gcomp.Error "mismatch").
    const gcomp::detail::Payload head = gcomp::detail::parse_payload(p.bytes());
    if (head.n != a.size()) {
      throw py::value_error("acc has " + std::to_string(a.size()) +
                            " elements; the payload holds " + std::to_string(head.n));
    }
  }
  {
    const DeviceScope scope(device);
    py::gil_scoped_release nogil;
    gcomp::decode_add(gcomp::TensorView<const std::byte>(p.byte_view()), a.float_view(),
                      static_cast<float>(alpha));
  }
  return py::reinterpret_borrow<py::object>(acc);
}

void momentum_correct(py::handle velocity, py::handle grad, double momentum) {
  const Held u(velocity, "velocity", Elem::float32, true);
  const Held g(grad, "grad", Elem::float32, true);
  if (u.size() != g.size()) {
    throw py::value_error("velocity has " + std::to_string(u.size()) + " elements, grad " +
                          std::to_string(g.size()));
  }
  py::gil_scoped_release nogil;
  gcomp::momentum_correct(u.floats(), g.floats(), static_cast<float>(momentum));
}

bool mask_momentum(py::handle velocity, py::handle residual) {
  const Held u(velocity, "velocity", Elem::float32, true);
  const Held r(residual, "residual", Elem::float32, false);
  if (u.size() != r.size()) {
    throw py::value_error("velocity has " + std::to_string(u.size()) + " elements, residual " +
                          std::to_string(r.size()));
  }
  py::gil_scoped_release nogil;
  return gcomp::mask_momentum(u.floats(), r.floats());
}

py::dict inspect(py::handle payload) {
  const Held p(payload, "payload", Elem::byte, false);
  gcomp::PayloadInfo info;
  {
    py::gil_scoped_release nogil;
    info = gcomp::inspect(p.bytes());
  }
  const std::string codec = gcomp::codec_name(info.kind);
  py::dict d;
  d["codec"] = codec;
  d["spec"] = info.params.empty() ? codec : codec + ":" + info.params;
  d["version"] = info.version;
  d["n"] = info.elements;
  d["bytes"] = info.total_bytes;
  d["header_bytes"] = info.header_bytes;
  d["ratio"] = info.total_bytes ? 4.0 * static_cast<double>(info.elements) /
                                      static_cast<double>(info.total_bytes)
                                : 0.0;
  d["sections"] = info.sections;
  return d;
}

py::list codecs() {
  py::list out;
  for (const gcomp::CodecDescription& c : gcomp::codec_catalog()) {
    py::list keys;
    py::dict defaults, help;
    for (const gcomp::SpecKey& k : c.keys) {
      keys.append(k.name);
      defaults[py::str(k.name)] =
          k.default_value.empty() ? py::object(py::none()) : py::object(py::str(k.default_value));
      help[py::str(k.name)] = k.help;
    }
    py::dict d;
    d["name"] = c.name;
    d["summary"] = c.summary;
    d["keys"] = keys;
    d["defaults"] = defaults;
    d["help"] = help;
    out.append(d);
  }
  return out;
}

// ---- MPI and the Communicator ----

struct PyCommunicator;

// MPI as this module sees it. All of it is touched with the GIL held.
struct Mpi {
  bool we_initialized = false;
  int provided = MPI_THREAD_SINGLE;
  std::mutex serial;  // below MPI_THREAD_MULTIPLE: one MPI call at a time in this process
  std::set<PyCommunicator*> live;
};
Mpi& mpi() {
  static Mpi* m = new Mpi;  // never destroyed: it outlives every Communicator
  return *m;
}

void finalize_at_exit();

void ensure_mpi() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) {
    throw gcomp::Error(Status::mpi, "MPI has been finalized; no Communicator can be made");
  }
  if (initialized) {
    MPI_Query_thread(&mpi().provided);
    return;
  }
  int provided = MPI_THREAD_SINGLE;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
    throw gcomp::Error(Status::mpi, "MPI_Init_thread failed");
  }
  mpi().provided = provided;
  mpi().we_initialized = true;
  py::module_::import("atexit").attr("register")(py::cpp_function(&finalize_at_exit));
}

// Below MPI_THREAD_MULTIPLE, one MPI call at a time in this process (and below
// MPI_THREAD_SERIALIZED, only from the main thread). Taken with the GIL released.
class Serial {
 public:
  Serial() {
    if (mpi().provided >= MPI_THREAD_MULTIPLE) return;
    if (mpi().provided < MPI_THREAD_SERIALIZED) {
      int main = 0;
      MPI_Is_thread_main(&main);
      if (!main) {
        throw gcomp::Error(Status::mpi,
                           "MPI was initialized below MPI_THREAD_SERIALIZED; call the "
                           "Communicator from the main thread");
      }
    }
    lock_ = std::unique_lock<std::mutex>(mpi().serial);
  }

 private:
  std::unique_lock<std::mutex> lock_;
};

struct PyCommunicator {
  std::unique_ptr<gcomp::Communicator> comm;
  bool on_mpi = true;  // MPI's rules (initialization, thread level, finalization) apply
  std::mutex busy;     // one call at a time, as the C++ Communicator requires

  // MPI_COMM_WORLD.
  PyCommunicator() {
    ensure_mpi();
    {
      py::gil_scoped_release nogil;
      const Serial serial;
      comm = std::make_unique<gcomp::Communicator>(MPI_COMM_WORLD);
    }
    mpi().live.insert(this);
  }
  // Gloo, met through store (store.hpp); no MPI.
  PyCommunicator(py::handle store, int rank, int size, const gcomp::GlooOptions& options)
      : on_mpi(false) {
#ifdef GCOMP_PY_HAVE_GLOO
    const std::unique_ptr<gloo::rendezvous::Store> s = gcomp::python::make_store(store);
    py::gil_scoped_release nogil;
    comm = std::make_unique<gcomp::Communicator>(*s, rank, size, options);
#else
    (void)store, (void)rank, (void)size, (void)options;
    throw gcomp::Error(Status::invalid_argument,
                       "this build of gcomp has no Gloo transport (gcomp.have_gloo() is False)");
#endif
    mpi().live.insert(this);
  }
  ~PyCommunicator() {
    mpi().live.erase(this);
    close();
  }
  PyCommunicator(const PyCommunicator&) = delete;
  PyCommunicator& operator=(const PyCommunicator&) = delete;

  // Frees the communicator (a collective over its ranks, as MPI_Comm_free is); after MPI was
  // finalized by someone else, forgets it instead.
  void close() {
    if (!comm) return;
    if (!on_mpi) {
      py::gil_scoped_release nogil;
      const std::lock_guard<std::mutex> own(busy);
      comm.reset();
      return;
    }
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) {
      (void)comm.release();  // its MPI objects went with MPI
      return;
    }
    py::gil_scoped_release nogil;
    const std::lock_guard<std::mutex> own(busy);
    const Serial serial;
    comm.reset();
  }

  gcomp::Communicator& get() const {
    if (!comm) {
      throw gcomp::Error(on_mpi ? Status::mpi : Status::invalid_argument,
                         on_mpi ? "this Communicator was closed when MPI was finalized"
                                : "this Communicator was closed");
    }
    return *comm;
  }
};

// The locks of one call, taken with the GIL released (MPI's only on MPI).
class Call {
 public:
  explicit Call(PyCommunicator& c) : own_(c.busy) {
    if (c.on_mpi) serial_.emplace();
  }

 private:
  std::lock_guard<std::mutex> own_;
  std::optional<Serial> serial_;
};

// Communicator(store=None, rank=None, size=None, ...): MPI_COMM_WORLD without a store, else Gloo.
std::unique_ptr<PyCommunicator> make_communicator(py::handle store, py::handle rank,
                                                  py::handle size, py::handle prefix,
                                                  py::handle interface, py::handle hostname,
                                                  py::handle host, double connect_seconds) {
  if (store.is_none()) {
    for (const auto& [name, v] : {std::pair{"rank", rank},
                                  {"size", size},
                                  {"prefix", prefix},
                                  {"interface", interface},
                                  {"hostname", hostname},
                                  {"host", host}}) {
      if (!v.is_none()) {
        throw py::value_error(std::string(name) +
                              "= is for a Communicator on Gloo (store=...); without a store the "
                              "Communicator is MPI_COMM_WORLD's");
      }
    }
    return std::make_unique<PyCommunicator>();
  }
  if (rank.is_none() || size.is_none()) {
    throw py::value_error("a Communicator on Gloo (store=...) needs rank= and size=");
  }
  gcomp::GlooOptions o;
  const auto text = [](py::handle v, const char* name, std::string& into) {
    if (v.is_none()) return;
    if (!py::isinstance<py::str>(v)) {
      throw py::type_error(std::string(name) + " must be a str or None, not " + type_name(v));
    }
    into = v.cast<std::string>();
  };
  text(prefix, "prefix", o.prefix);
  text(interface, "interface", o.interface);
  text(hostname, "hostname", o.hostname);
  text(host, "host", o.host);
  o.connect_seconds = connect_seconds;
  const auto to_int = [](py::handle v, const char* name) {
    if (!py::isinstance<py::int_>(v) || py::isinstance<py::bool_>(v)) {
      throw py::type_error(std::string(name) + " must be an int, not " + type_name(v));
    }
    return v.cast<int>();
  };
  return std::make_unique<PyCommunicator>(store, to_int(rank, "rank"), to_int(size, "size"), o);
}

void finalize_at_exit() {
  for (PyCommunicator* c : std::set<PyCommunicator*>(mpi().live)) c->close();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (mpi().we_initialized && !finalized) {
    py::gil_scoped_release nogil;
    MPI_Finalize();
  }
}

// Runs the conversion of a collective's arguments; when it fails, this rank still takes its part
// (Communicator::abandon), so that the other ranks raise too instead of waiting, and the
// conversion's own error is raised here.
template <class F>
auto prepared(PyCommunicator& self, F&& f) -> decltype(f()) {
  gcomp::Communicator& comm = self.get();
  try {
    return f();
  } catch (...) {
    const std::exception_ptr failure = std::current_exception();
    Status status = Status::invalid_argument;
    std::string why = "a bad argument";
    try {
      std::rethrow_exception(failure);
    } catch (const gcomp::Error& e) {
      status = e.code();
      why = e.what();
    } catch (const py::error_already_set& e) {
      why = e.what();
    } catch (const std::exception& e) {
      why = e.what();
    } catch (...) {
    }
    try {
      py::gil_scoped_release nogil;
      const Call call(self);
      comm.abandon(status, why);
    } catch (...) {
      // The caller learns of its own failure; MPI's trouble telling the others is secondary.
    }
    std::rethrow_exception(failure);
  }
}

// The call's options. Its seed is seed as given, or with a step, gcomp::step_seed(seed, step,
// index): a training loop's call index within the step mixed in here, not by each caller.
gcomp::AllreduceOptions options_of(py::handle algorithm, py::handle average, py::handle seed,
                                   py::handle allow_uncompressed, py::handle step,
                                   py::handle index) {
  gcomp::AllreduceOptions o;
  if (!py::isinstance<py::str>(algorithm)) {
    throw py::type_error("algorithm must be a str, not " + type_name(algorithm));
  }
  o.algorithm = gcomp::parse_algorithm(algorithm.cast<std::string>());
  o.average = average.cast<bool>();
  o.seed = to_seed(seed);
  const std::uint64_t i = to_seed(index, "index");
  if (!step.is_none()) {
    o.seed = gcomp::step_seed(o.seed, to_seed(step, "step"), i);
  } else if (i != 0) {
    throw py::value_error("index " + std::to_string(i) + " without a step: pass step too");
  }
  o.allow_uncompressed = allow_uncompressed.cast<bool>();
  return o;
}

// The call's name in a stall report or a timeout (AllreduceOptions::label): label as given,
// else "step S, index I" where a step is given, else none.
std::string label_of(py::handle label, py::handle step, py::handle index) {
  if (!label.is_none()) {
    if (!py::isinstance<py::str>(label)) {
      throw py::type_error("label must be a str or None, not " + type_name(label));
    }
    return label.cast<std::string>();
  }
  if (step.is_none()) return {};
  return "step " + std::to_string(to_seed(step, "step")) + ", index " +
         std::to_string(to_seed(index, "index"));
}

const gcomp::Codec& codec_of(py::handle codec, std::optional<gcomp::Codec>& made) {
  if (py::isinstance<gcomp::Codec>(codec)) return codec.cast<const gcomp::Codec&>();
  if (py::isinstance<py::str>(codec)) return made.emplace(codec.cast<std::string>());
  throw py::type_error("codec must be a gcomp.Codec or a spec str, not " + type_name(codec));
}

py::object allreduce(PyCommunicator& self, py::handle x, py::handle codec, py::handle ef,
                     py::handle algorithm, py::handle average, py::handle seed,
                     py::handle allow_uncompressed, py::handle step, py::handle index,
                     py::handle label, py::handle stream) {
  std::optional<Held> buf;
  CallStream st;
  int device = -1;
  std::string label_text;
  std::optional<gcomp::Codec> made;
  const gcomp::Codec* c = nullptr;
  PyErrorFeedback* e = nullptr;
  std::optional<Using> using_ef;
  gcomp::AllreduceOptions options;
  prepared(self, [&] {
    st = to_stream(stream);
    buf.emplace(x, "x", Elem::float32, true, &st);
    device = same_memory({&*buf}, st);
    c = &codec_of(codec, made);
    e = to_ef(ef, *buf, "ef");
    using_ef.emplace(e);
    options = options_of(algorithm, average, seed, allow_uncompressed, step, index);
    label_text = label_of(label, step, index);
    if (!label_text.empty()) options.label = label_text.c_str();
  });
  {
    const DeviceScope scope(device);
    py::gil_scoped_release nogil;
    const Call call(self);
    self.get().allreduce(buf->float_view(), *c, e ? &e->ef : nullptr, options);
  }
  return py::reinterpret_borrow<py::object>(x);
}

// What the next auto call for this codec and size would do (Communicator::choose).
py::dict choose(PyCommunicator& self, py::handle codec, std::size_t n, bool allow_uncompressed) {
  std::optional<gcomp::Codec> made;
  const gcomp::Codec& c = codec_of(codec, made);
  gcomp::Choice choice;
  {
    py::gil_scoped_release nogil;
    const Call call(self);
    choice = self.get().choose(c, n, 0, allow_uncompressed);
  }
  py::dict d;
  d["algorithm"] = gcomp::algorithm_name(choice.algorithm);
  d["compressed"] = choice.compressed;
  return d;
}

// A tensor's shape as a matrix: rows = its first dimension, cols = the product of the others (a
// tuple, list or torch.Size of non-negative ints; () is 1 x 1).
gcomp::MatrixShape matrix_shape(py::handle s, const std::string& what) {
  if (!py::isinstance<py::sequence>(s) || py::isinstance<py::str>(s)) {
    throw py::type_error(what + " must be a shape (a tuple of ints), not " + type_name(s));
  }
  const py::sequence dims = py::reinterpret_borrow<py::sequence>(s);
  gcomp::MatrixShape m{1, 1};
  for (std::size_t d = 0; d < dims.size(); ++d) {
    const std::size_t v = to_count(dims[d], what + "[" + std::to_string(d) + "]");
    if (d == 0) {
      m.rows = v;
    } else if (v != 0 && m.cols > std::numeric_limits<std::size_t>::max() / v) {
      throw py::value_error(what + " is too large");
    } else {
      m.cols *= v;
    }
  }
  return m;
}

py::object allreduce_buckets(PyCommunicator& self, py::handle tensors, py::handle codec,
                             py::handle efs, py::handle bucket_bytes, py::handle dense_below,
                             py::handle average, py::handle seed, py::handle algorithm,
                             py::handle allow_uncompressed, py::handle step, py::handle index,
                             py::handle shapes, py::handle label, py::handle stream) {
  std::deque<Held> bufs;
  CallStream st;
  int device = -1;
  std::string label_text;
  std::vector<gcomp::MatrixShape> matrices;
  std::vector<gcomp::TensorView<float>> spans;
  std::vector<gcomp::ErrorFeedback*> memories;
  std::deque<Using> using_efs;
  std::optional<gcomp::Codec> made;
  const gcomp::Codec* c = nullptr;
  gcomp::BucketOptions options;
  prepared(self, [&] {
    if (!py::isinstance<py::sequence>(tensors) || py::isinstance<py::str>(tensors)) {
      throw py::type_error("tensors must be a list of " + std::string(needed(Elem::float32)) +
                           "s, not " + type_name(tensors));
    }
    const py::sequence ts = py::reinterpret_borrow<py::sequence>(tensors);
    st = to_stream(stream);
    std::vector<const Held*> held;
    for (std::size_t t = 0; t < ts.size(); ++t) {
      bufs.emplace_back(ts[t], "tensors[" + std::to_string(t) + "]", Elem::float32, true, &st);
      spans.push_back(bufs.back().float_view());
      held.push_back(&bufs.back());
    }
    device = same_memory(held, st);
    c = &codec_of(codec, made);
    if (!efs.is_none()) {
      if (!py::isinstance<py::sequence>(efs)) {
        throw py::type_error("efs must be None or a list of gcomp.ErrorFeedback (or None), not " +
                             type_name(efs));
      }
      const py::sequence es = py::reinterpret_borrow<py::sequence>(efs);
      if (es.size() != ts.size()) {
        throw py::value_error(std::to_string(es.size()) + " error-feedback memories for " +
                              std::to_string(ts.size()) + " tensors");
      }
      for (std::size_t t = 0; t < es.size(); ++t) {
        PyErrorFeedback* e = to_ef(es[t], bufs[t], "efs[" + std::to_string(t) + "]");
        memories.push_back(e ? &e->ef : nullptr);
        if (e) using_efs.emplace_back(e);
      }
    }
    if (!shapes.is_none()) {
      if (!py::isinstance<py::sequence>(shapes) || py::isinstance<py::str>(shapes)) {
        throw py::type_error("shapes must be None or a list of shapes (tuples of ints), not " +
                             type_name(shapes));
      }
      const py::sequence ss = py::reinterpret_borrow<py::sequence>(shapes);
      if (ss.size() != ts.size()) {
        throw py::value_error(std::to_string(ss.size()) + " shapes for " +
                              std::to_string(ts.size()) + " tensors");
      }
      for (std::size_t t = 0; t < ss.size(); ++t) {
        matrices.push_back(matrix_shape(ss[t], "shapes[" + std::to_string(t) + "]"));
        if (matrices.back().rows * matrices.back().cols != spans[t].size()) {
          throw py::value_error("shapes[" + std::to_string(t) + "] holds " +
                                std::to_string(matrices.back().rows * matrices.back().cols) +
                                " elements, tensors[" + std::to_string(t) + "] " +
                                std::to_string(spans[t].size()));
        }
      }
    }
    options.bucket_bytes = to_count(bucket_bytes, "bucket_bytes");
    options.dense_below = to_count(dense_below, "dense_below");
    options.allreduce = options_of(algorithm, average, seed, allow_uncompressed, step, index);
    label_text = label_of(label, step, index);
    if (!label_text.empty()) options.allreduce.label = label_text.c_str();
  });
  {
    const DeviceScope scope(device);
    py::gil_scoped_release nogil;
    const Call call(self);
    if (shapes.is_none()) {
      self.get().allreduce_buckets(spans, *c, memories, options);
    } else {
      self.get().allreduce_buckets(spans, matrices, *c, memories, options);
    }
  }
  return py::reinterpret_borrow<py::object>(tensors);
}

// The keys both stats dicts have.
template <class Stats>
py::dict stats_dict(const Stats& s) {
  py::dict d;
  d["calls"] = s.calls;
  d["bytes_sent"] = s.bytes_sent;
  d["bytes_received"] = s.bytes_received;
  d["encode_seconds"] = s.encode_seconds;
  d["comm_seconds"] = s.comm_seconds;
  d["decode_seconds"] = s.decode_seconds;
  d["agree_seconds"] = s.agree_seconds;
  return d;
}

// Calls per algorithm, the algorithms used only.
py::dict by_algorithm(const std::array<std::uint64_t, gcomp::kAlgorithmCount>& counts) {
  py::dict by;
  for (int a = 0; a < gcomp::kAlgorithmCount; ++a) {
    if (counts[a]) by[gcomp::algorithm_name(static_cast<gcomp::Algorithm>(a))] = counts[a];
  }
  return by;
}

py::dict last_stats(const PyCommunicator& self) {
  const gcomp::CallStats& s = self.get().last_stats();
  py::dict d = stats_dict(s);
  d["algorithm"] =
      s.calls ? py::object(py::str(gcomp::algorithm_name(s.algorithm))) : py::object(py::none());
  d["compressed"] = s.compressed;
  d["algorithms"] = by_algorithm(s.by_algorithm);
  d["compressed_calls"] = s.compressed_calls;
  return d;
}

py::dict totals_dict(const gcomp::TotalStats& s) {
  py::dict d = stats_dict(s);
  d["algorithm"] = by_algorithm(s.by_algorithm);
  d["compressed"] = s.compressed;
  return d;
}

py::dict total_stats(const PyCommunicator& self) { return totals_dict(self.get().total_stats()); }

// Counts comm's last call into t with the library's own sum (TotalStats::add). Without
// codec_applied (gcomp.torch's warm-up steps and small buckets, sent with codec none on purpose)
// it adds no compressed calls, as allreduce_buckets' dense bucket adds none to last_stats.
void add_last_call(gcomp::TotalStats& t, const PyCommunicator& comm, bool codec_applied) {
  gcomp::CallStats s = comm.get().last_stats();
  if (!codec_applied) s.compressed_calls = 0;
  t.add(s);
}

// The setter of one of the Communicator's waits (stall_seconds, timeout_seconds): never while a
// call runs (it waits for the call, the GIL released).
auto wait_setter(void (gcomp::Communicator::*set)(double)) {
  return [set](PyCommunicator& c, double seconds) {
    py::gil_scoped_release nogil;
    const std::lock_guard<std::mutex> own(c.busy);
    (c.get().*set)(seconds);
  };
}

// The algorithms' names from the table, quoted and comma-separated, in lines of at most 80
// characters, the first of at most `first` (the rest of its line is taken).
std::string algorithm_list(std::size_t first) {
  std::string out, line;
  std::size_t room = first;
  for (int a = 1; a < gcomp::kAlgorithmCount; ++a) {
    const bool last = a + 1 == gcomp::kAlgorithmCount;
    const std::string word = std::string("\"") +
                             gcomp::algorithm_name(static_cast<gcomp::Algorithm>(a)) +
                             (last ? "\"." : "\",");
    if (!line.empty() && line.size() + 1 + word.size() > room) {
      out += line + "\n";
      line.clear();
      room = 80;
    }
    line += (line.empty() ? "" : " ") + word;
  }
  return out + line;
}

// Communicator.allreduce's docstring (its list of algorithms from the table).
const std::string& allreduce_doc() {
  static const std::string lead = "Algorithms (docs/algorithms.md): ";
  static const std::string doc =
      "allreduce(x, codec, ef=None, algorithm=\"auto\", average=False, seed=0,\n"
      "          allow_uncompressed=True, step=None, index=0, label=None, stream=None) -> x\n\n"
      "x (a 1-D float32 numpy array or torch tensor, CPU or CUDA) becomes, in place, the sum "
      "over\n"
      "ranks (the mean with average=True) of what each rank's codec sent. codec: a\n"
      "gcomp.Codec or a spec. ef: this rank's gcomp.ErrorFeedback for x, or None.\n"
      "algorithm: \"auto\" (the cost model's choice; it may send x uncompressed when no\n"
      "compression pays; allow_uncompressed=False keeps it to the algorithms that apply\n"
      "the codec) or one of the algorithms listed below. step, index: a training\n"
      "loop's step and the call's place in it (a bucket's index); with a step, the seed\n"
      "used is gcomp.step_seed(seed, step, index), so that the calls of a step, and the\n"
      "steps, draw differently; step=None uses seed as given (index must then be 0).\n"
      "label: the call's name in a stall report or a timeout (stall_seconds; default\n"
      "\"step S, index I\" where a step is given). A CUDA x (with ef on its device) is\n"
      "encoded and decoded on the GPU on stream (as Codec.encode's; returns when x holds\n"
      "the result) and only payloads cross to host memory for MPI. The GIL is released\n"
      "while it runs.\n\n" +
      lead + algorithm_list(80 - lead.size());
  return doc;
}

}  // namespace

PYBIND11_MODULE(_gcomp, m) {
  m.doc() = "The compiled part of the gcomp package; import gcomp instead.";
  // Every docstring starts with its Python signature; pybind11's own would say "handle".
  py::options options;
  options.disable_function_signatures();
  m.attr("__version__") = GCOMP_VERSION;
#if PYBIND11_VERSION_HEX < 0x020C0000
  // pybind11 before 2.12 reads numpy 1's array descriptor: under numpy 2 the arrays it makes
  // have stride 0 (seen on a GPU machine: every payload was its first byte repeated). Refuse.
  {
    const std::string numpy = py::module_::import("numpy").attr("__version__").cast<std::string>();
    if (std::atoi(numpy.c_str()) >= 2) {
      throw py::import_error(
          "gcomp's module was built with pybind11 " + std::to_string(PYBIND11_VERSION_MAJOR) +
          "." + std::to_string(PYBIND11_VERSION_MINOR) + ", which predates numpy 2, and numpy " +
          numpy + " is installed: its arrays would be wrong. Rebuild gcomp with pybind11 2.12 "
          "or later (cmake -Dpybind11_DIR=\"$(python3 -m pybind11 --cmakedir)\"), or use "
          "numpy 1.");
    }
  }
#endif

  g_error = PyErr_NewExceptionWithDoc(
      "gcomp.Error",
      "An error of the gcomp library.\n\n"
      "``status`` names its kind: \"invalid_argument\", \"bad_payload\", \"buffer_too_small\",\n"
      "\"nonfinite\", \"mpi\", \"cuda\", \"mismatch\", \"internal\" or \"timeout\" (a rank did\n"
      "not come to a call within Communicator.timeout_seconds); the message names the\n"
      "offending value. In a collective, a failure on one rank raises on every rank: that rank\n"
      "with its own status, the others with \"mismatch\" naming the rank and the reason.",
      PyExc_RuntimeError, nullptr);
  if (g_error == nullptr) throw py::error_already_set();
  PyObject_SetAttrString(g_error, "status", Py_None);
  m.add_object("Error", py::handle(g_error));
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const gcomp::Error& e) {
      raise_gcomp_error(e.code(), e.what());
    }
  });

  gcomp::python::bind_arrays(m);
  m.def(
      "device_status",
      [] {
        py::dict d;
        d["backend"] = devices().name();
        const std::string why = devices().unusable();
        d["usable"] = why.empty();
        d["why"] = why;
        return d;
      },
      "device_status() -> dict\n\n"
      "Whether this gcomp takes CUDA arrays here: backend (\"cuda\": built with gcomp's CUDA\n"
      "kernels; \"none\": built without; \"standin\": the test-only build, whose \"device\"\n"
      "memory is host memory), usable (a GPU is there to use) and why (when not).");
  devices().bind(m);

  m.def("codecs", &codecs,
        "codecs() -> list of dict\n\n"
        "Every codec: its name, summary, spec keys, each key's default (None: required or one of\n"
        "a required pair) and help, as `gcomp list` prints them.");
  m.def(
      "simd_level", [] { return std::string(gcomp::simd_level()); },
      "simd_level() -> str\n\nThe SIMD kernels in use: \"avx512\", \"avx2\" or \"baseline\" "
      "(at most GCOMP_SIMD when set).");
  m.def("set_num_threads", &gcomp::set_num_threads, py::arg("threads"),
        "set_num_threads(threads)\n\nThreads the library may use inside one call (>= 1; default "
        "GCOMP_NUM_THREADS, else 1).");
  m.def("num_threads", &gcomp::num_threads, "num_threads() -> int\n\nSee set_num_threads.");
  m.def("have_gloo", &gcomp::have_gloo,
        "have_gloo() -> bool\n\n"
        "Whether this build has the Gloo transport (Communicator(store=...), and gcomp.torch\n"
        "without mpiexec).");
  m.def(
      "set_wait_policy",
      [](std::string_view name) { gcomp::set_wait_policy(gcomp::parse_wait_policy(name)); },
      py::arg("policy"),
      "set_wait_policy(policy)\n\n"
      "How every wait for MPI in this process completes: \"spin\" (MPI_Wait, a core busy while\n"
      "waiting), \"yield\" (poll, yielding the CPU), \"sleep\" (poll 20 us, then sleep up to\n"
      "100 us between polls: for communication beside compute on the same cores), or \"auto\"\n"
      "(GCOMP_WAIT when set, else spin, or yield where ranks outnumber a node's cores). A bad\n"
      "name raises gcomp.Error (invalid_argument).");
  m.def(
      "step_seed",
      [](py::handle seed, py::handle step, py::handle index) {
        return gcomp::step_seed(to_seed(seed), to_seed(step, "step"), to_seed(index, "index"));
      },
      py::arg("seed"), py::arg("step"), py::arg("index") = 0,
      "step_seed(seed, step, index=0) -> int\n\n"
      "The seed of one call of a training loop (gcomp::step_seed, include/gcomp/codec.hpp):\n"
      "from the user's seed, the step and the call's index within the step (a bucket's), so\n"
      "that the calls of a step, and the steps, draw differently. Communicator.allreduce\n"
      "and allreduce_buckets use it when given a step.");
  m.def(
      "wait_policy",
      [] { return std::string(gcomp::wait_policy_name(gcomp::effective_wait_policy())); },
      "wait_policy() -> str\n\nWhat waits do now: \"spin\", \"yield\" or \"sleep\" (see "
      "set_wait_policy).");

  py::class_<gcomp::Codec>(
      m, "Codec",
      "A codec, made from a spec \"name[:key=value,...]\" (see gcomp.codecs()).\n\n"
      "Immutable; one Codec may be used by many threads at once. A bad spec\n"
      "raises gcomp.Error (status \"invalid_argument\") naming the spec and\n"
      "the bad part.")
      .def(py::init<std::string_view>(), py::arg("spec"), "Codec(spec)")
      .def_property_readonly("spec", &gcomp::Codec::spec,
                             "The canonical spec, every key spelled out.")
      .def_property_readonly(
          "properties",
          [](const gcomp::Codec& c) {
            const gcomp::CodecProperties p = c.properties();
            py::dict d;
            d["sparse"] = p.sparse;
            d["unbiased"] = p.unbiased;
            d["stochastic"] = p.stochastic;
            d["shared_support"] = p.shared_support;
            d["contraction"] = p.contraction;
            d["low_rank"] = p.low_rank;
            d["needs_shapes"] = p.needs_shapes;
            d["bits_per_element"] = p.bits_per_element;
            d["value_bytes"] = p.value_bytes;
            d["elementwise"] = p.elementwise;
            d["split_per_tensor"] = p.split_per_tensor;
            d["sends_late"] = p.sends_late;
            d["variance_bound"] = p.variance_bound;
            d["start_steps"] = p.start_steps;
            return d;
          },
          "What the codec promises: sparse, unbiased, stochastic, shared_support (every rank\n"
          "selects the same indices: random-k), contraction (its error |x - C(x)|^2 <=\n"
          "(1 - delta) |x|^2, so error feedback applies by default; not QSGD, TernGrad, scaled\n"
          "random-k, none), low_rank (powersgd: runs only on the low_rank algorithm),\n"
          "needs_shapes (allreduce_buckets must be given shapes=), bits_per_element (dense\n"
          "codecs), value_bytes (sparse codecs: 4, or 2 with values=fp16), elementwise (each\n"
          "value sent depends on its element alone: none, fp16, bf16, threshold),\n"
          "split_per_tensor (one scale per call: sign, terngrad), sends_late (with error\n"
          "feedback much of each gradient is sent late: the sparsifiers, sign),\n"
          "variance_bound (omega of E|C(x) - x|^2 <= omega |x|^2 for every size; nan where\n"
          "none is known), start_steps (steps sent uncompressed first: powersgd's start=).")
      .def("max_bytes", &gcomp::Codec::max_bytes, py::arg("n"),
           "max_bytes(n) -> int\n\nAn upper bound of the bytes encode writes for n floats.")
      .def("selected", &gcomp::Codec::selected, py::arg("n"),
           "selected(n) -> int\n\nElements a sparse codec keeps out of n (0 for dense codecs).")
      .def("encode", &encode, py::arg("x"), py::arg("seed") = 0, py::arg("ef") = py::none(),
           py::arg("out") = py::none(), py::arg("stream") = py::none(),
           "encode(x, seed=0, ef=None, out=None, stream=None) -> numpy.ndarray (uint8) or\n"
           "    gcomp.DeviceArray\n\n"
           "Encodes x (a 1-D float32 numpy array or torch tensor, CPU or CUDA, used in place,\n"
           "never modified) into a payload. With ef (a gcomp.ErrorFeedback of x's size, in x's\n"
           "memory), encodes x + residual and keeps what was not sent as the new residual. With\n"
           "out (a writable 1-D uint8 array of at least max_bytes(len(x)) bytes, in x's memory),\n"
           "writes there and returns the written prefix as a view of out, allocating nothing.\n"
           "A CUDA x runs gcomp's CUDA kernels on stream (a cudaStream_t as an int, or a\n"
           "torch.cuda.Stream; None: the legacy default stream), ordered after the work already\n"
           "queued there, and returns when the payload is complete: without out, a\n"
           "gcomp.DeviceArray (torch.from_dlpack takes it); its bytes are those the CPU writes\n"
           "for the same values. The GIL is released while it runs. NaN/Inf in x (or x +\n"
           "residual) raises gcomp.Error(\"nonfinite\"), leaving ef as it was.")
      .def("__repr__", [](const gcomp::Codec& c) { return "gcomp.Codec('" + c.spec() + "')"; });

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

  m.def("decode_add", &decode_add, py::arg("payload"), py::arg("acc"), py::arg("alpha") = 1.0,
        py::arg("stream") = py::none(),
        "decode_add(payload, acc, alpha=1.0, stream=None) -> acc\n\n"
        "acc += alpha * decode(payload), in place. acc is a 1-D float32 numpy array or torch\n"
        "tensor of the payload's element count, in the payload's memory (both host, or both on\n"
        "one CUDA device: then on stream, as encode). The payload is validated in full first;\n"
        "on any error (gcomp.Error \"bad_payload\" for a corrupt or truncated one) acc is\n"
        "unchanged. The GIL is released while it runs.");
  m.def("momentum_correct", &momentum_correct, py::arg("velocity"), py::arg("grad"),
        py::arg("momentum"),
        "momentum_correct(velocity, grad, momentum) -> None\n\n"
        "DGC's momentum correction before compression, in place: velocity = momentum * velocity\n"
        "+ grad, then grad = velocity (1-D float32 arrays or torch CPU tensors of one size;\n"
        "momentum in [0, 1)). Compress grad with error feedback, then call mask_momentum.");
  m.def("mask_momentum", &mask_momentum, py::arg("velocity"), py::arg("residual"),
        "mask_momentum(velocity, residual) -> bool\n\n"
        "Momentum factor masking after the allreduce, in place: velocity = 0 wherever the\n"
        "error-feedback residual is 0 (its value was sent), unless the whole residual is 0 (the\n"
        "tensor went whole: plain momentum). Returns whether it masked.");
  m.def("inspect", &inspect, py::arg("payload"),
        "inspect(payload) -> dict\n\n"
        "Validates a payload as decode_add would and describes it: codec, spec (the codec and\n"
        "the parameters the payload records), version, n (elements), bytes, header_bytes,\n"
        "ratio (4 n / bytes) and sections (the byte length of each).");

  py::class_<PyCommunicator>(
      m, "Communicator",
      "Communicator(store=None, rank=None, size=None, prefix=None, interface=None,\n"
      "             hostname=None, host=None, connect_seconds=300.0)\n\n"
      "gcomp's collectives over a transport (docs/python.md, \"Transports\"):\n\n"
      "* store=None: MPI_COMM_WORLD (collective over it). Initializes MPI on first use\n"
      "  (MPI_Init_thread asking for MPI_THREAD_MULTIPLE) and, when it did, finalizes it at\n"
      "  interpreter exit. Launch with ``mpiexec.mpich -n 4 /usr/bin/python3 script.py``.\n"
      "* store given: Gloo over TCP, without MPI, among the size processes that make it with\n"
      "  the same store and prefix, each with its rank. store: a directory every process sees\n"
      "  (Gloo's file store; made if missing) or an object with set/get/wait, such as a\n"
      "  torch.distributed.Store (gcomp.torch passes torch's own). prefix (default \"gcomp\"):\n"
      "  the rendezvous' keys, one per Communicator on a store. interface: the network\n"
      "  interface (default GLOO_SOCKET_IFNAME, else the address of hostname, else of the\n"
      "  host's name). host: this process's host for the cost model (default GCOMP_HOST, else\n"
      "  the host's name and network namespace). connect_seconds: how long the rendezvous may\n"
      "  take before it raises gcomp.Error (\"transport\").\n\n"
      "Measures the network when made. Every call is collective: all ranks pass the same\n"
      "codec, sizes, options and seed; a rank that disagrees or fails (a bad argument, NaN in\n"
      "its input) makes every rank raise instead of hang. One call at a time per Communicator\n"
      "(calls from other threads wait).")
      .def(py::init(&make_communicator), py::arg("store") = py::none(),
           py::arg("rank") = py::none(), py::arg("size") = py::none(),
           py::arg("prefix") = py::none(), py::arg("interface") = py::none(),
           py::arg("hostname") = py::none(), py::arg("host") = py::none(),
           py::arg("connect_seconds") = 300.0,
           "Communicator(store=None, rank=None, size=None, prefix=None, interface=None, "
           "hostname=None, host=None, connect_seconds=300.0)")
      .def_property_readonly(
          "transport",
          [](const PyCommunicator& c) { return gcomp::transport_name(c.get().transport()); },
          "The transport under this Communicator: \"mpi\" or \"gloo\".")
      .def_property_readonly(
          "hosts", [](const PyCommunicator& c) { return c.get().hosts(); },
          "Every rank's host as the transport tells them apart: hosts[r] is the lowest rank on\n"
          "rank r's host.")
      .def_property_readonly(
          "rank", [](const PyCommunicator& c) { return c.get().rank(); }, "This process's rank.")
      .def_property_readonly(
          "size", [](const PyCommunicator& c) { return c.get().size(); }, "The number of ranks.")
      .def_property_readonly(
          "network",
          [](const PyCommunicator& c) {
            const gcomp::NetworkModel& n = c.get().network();
            py::dict d;
            d["alpha"] = n.alpha;
            d["beta"] = n.beta;
            d["beta_all"] = n.beta_all;
            d["beta_one"] = n.beta_one;
            d["beta_allreduce"] = n.beta_allreduce;
            d["beta_allreduce_large"] = n.beta_allreduce_large;
            return d;
          },
          "The network the cost model measured (seconds, seconds per byte; docs/algorithms.md).")
      .def("allreduce", &allreduce, py::arg("x"), py::arg("codec"), py::arg("ef") = py::none(),
           py::arg("algorithm") = "auto", py::arg("average") = false, py::arg("seed") = 0,
           py::arg("allow_uncompressed") = true, py::arg("step") = py::none(), py::arg("index") = 0,
           py::arg("label") = py::none(), py::arg("stream") = py::none(), allreduce_doc().c_str())
      .def_property(
          "stall_seconds", [](const PyCommunicator& c) { return c.get().stall_seconds(); },
          wait_setter(&gcomp::Communicator::set_stall_seconds),
          "Seconds a rank waits at the start of a call for a rank that has not come before it\n"
          "prints once, to stderr, the call (its number, size, codec, label) and the ranks not\n"
          "there with where each is (default GCOMP_STALL_SECONDS, else 60; 0: never).")
      .def_property(
          "timeout_seconds", [](const PyCommunicator& c) { return c.get().timeout_seconds(); },
          wait_setter(&gcomp::Communicator::set_timeout_seconds),
          "Seconds after which that wait raises gcomp.Error (status \"timeout\") naming them\n"
          "instead of waiting on (default GCOMP_TIMEOUT_SECONDS, else 0: never). The\n"
          "Communicator can make no more calls then (each raises \"timeout\"): end the job.")
      .def_property_readonly(
          "calls", [](const PyCommunicator& c) { return c.get().calls(); },
          "The calls made so far, as the stall report numbers them.")
      .def("allreduce_buckets", &allreduce_buckets, py::arg("tensors"), py::arg("codec"),
           py::arg("efs") = py::none(), py::arg("bucket_bytes") = 25u << 20,
           py::arg("dense_below") = 1024, py::arg("average") = false, py::arg("seed") = 0,
           py::arg("algorithm") = "auto", py::arg("allow_uncompressed") = true,
           py::arg("step") = py::none(), py::arg("index") = 0, py::arg("shapes") = py::none(),
           py::arg("label") = py::none(), py::arg("stream") = py::none(),
           "allreduce_buckets(tensors, codec, efs=None, bucket_bytes=25 << 20, dense_below=1024,\n"
           "                  average=False, seed=0, algorithm=\"auto\",\n"
           "                  allow_uncompressed=True, step=None, index=0, shapes=None,\n"
           "                  label=None, stream=None)\n"
           "                  -> tensors\n\n"
           "Allreduces a list of tensors in place, fused into buckets of at most bucket_bytes\n"
           "of float32, one collective each; tensors of fewer than dense_below elements are\n"
           "summed uncompressed. efs: None or one gcomp.ErrorFeedback (or None) per tensor.\n"
           "A tensor larger than bucket_bytes is a bucket of its own (bucket_bytes=1: one\n"
           "collective per tensor, each compressed on its own). step, index: as allreduce's.\n"
           "shapes: None, or each tensor's shape (a tuple of ints, torch.Size), viewed as a\n"
           "matrix of rows = shape[0] and cols = the product of the rest, which a low-rank\n"
           "codec needs (powersgd: each matrix sends its rank-r factors, with efs holding the\n"
           "residual and warm-start Q per tensor; 1-D and small matrices go dense) and the\n"
           "other codecs ignore. The tensors themselves may be flat. label: as allreduce's.\n"
           "The tensors are all in host memory or all on one CUDA device (then on stream, as\n"
           "allreduce's).")
      .def("choose", &choose, py::arg("codec"), py::arg("n"), py::arg("allow_uncompressed") = true,
           "choose(codec, n, allow_uncompressed=True) -> {\"algorithm\": str, \"compressed\": "
           "bool}\n\n"
           "What the next allreduce with algorithm=\"auto\" of n float32 elements with this codec\n"
           "(no error feedback, not averaged) would do: the cost model's choice first, then what\n"
           "it learns from its own calls (docs/algorithms.md). compressed=False: it would send x\n"
           "uncompressed. Collective the first time for a codec and size (the ranks measure and\n"
           "agree on the codec's speed): every rank calls it with the same arguments.")
      .def_property_readonly("last_stats", &last_stats,
                             "What the last call did: calls (collectives made), bytes_sent,\n"
                             "bytes_received, encode_seconds, comm_seconds (agree_seconds: its\n"
                             "agreement), decode_seconds,\n"
                             "algorithm (of its last collective), compressed (whether the\n"
                             "codec was applied), algorithms (calls per algorithm) and\n"
                             "compressed_calls (the calls that applied the codec).")
      .def_property_readonly("total_stats", &total_stats,
                             "Totals over this Communicator's collectives: calls, bytes_sent,\n"
                             "bytes_received, the four seconds, algorithm (calls per algorithm)\n"
                             "and compressed (calls that applied the codec).");

  py::class_<gcomp::TotalStats>(
      m, "TotalStats",
      "TotalStats(): running totals of calls' statistics, zero at first, summed as the\n"
      "Communicator sums its total_stats (by the library, one sum for both). For totals of a\n"
      "part of a program's calls, such as gcomp.torch's per model.")
      .def(py::init<>(), "TotalStats()")
      .def("add", &add_last_call, py::arg("comm"), py::arg("codec_applied") = true,
           "add(comm, codec_applied=True)\n\n"
           "Counts comm's last call (comm.last_stats: one allreduce, or every bucket of an\n"
           "allreduce_buckets) in. codec_applied=False counts none of its collectives as\n"
           "compressed (a call that sent codec none on purpose, such as a warm-up step).")
      .def("as_dict", &totals_dict,
           "as_dict() -> dict\n\n"
           "The totals, with the keys of Communicator.total_stats: calls, bytes_sent,\n"
           "bytes_received, the four seconds, algorithm (calls per algorithm) and compressed.")
      .def("__repr__", [](const gcomp::TotalStats& t) {
        return "gcomp.TotalStats(calls=" + std::to_string(t.calls) + ")";
      });
}
