// gcomp._gcomp: the Python binding of gcomp's C++ API (include/gcomp/codec.hpp, communicator.hpp),
// re-exported by the package gcomp (python/gcomp/__init__.py). Reference: docs/python.md.
//
// What the binding does and nothing more: it takes arrays and tensors in place, in host memory or
// on a CUDA device (arrays.cpp), checks that each is what the call needs (dtype, 1-D, contiguous,
// aligned, writable, size, one memory per call) and says so otherwise, releases the GIL around
// every call into the library, turns gcomp::Error into gcomp.Error, and initializes and
// finalizes MPI for the Communicator (mpi_lifetime.cpp). Every computation is the C++ library's.
// By subject: the conversions (arrays.cpp), the codecs (codecs.cpp), error feedback
// (feedback.cpp), the Communicator (communicator.cpp); this file makes the module of them, with
// gcomp.Error and the process-wide settings.
#include <pybind11/pybind11.h>

#include <cstdlib>
#include <string>
#include <string_view>

// The pybind11 that CMake found (python/CMakeLists.txt) must be the one whose headers come first.
#if defined(GCOMP_PYBIND11_FOUND_MAJOR) &&                    \
    (PYBIND11_VERSION_MAJOR != GCOMP_PYBIND11_FOUND_MAJOR || \
     PYBIND11_VERSION_MINOR != GCOMP_PYBIND11_FOUND_MINOR)
#error "pybind11's headers are not the pybind11 CMake found: another include folder comes first"
#endif

#include "binding.hpp"
#include "gcomp/communicator.hpp"
#include "gcomp/timeline.hpp"

namespace py = pybind11;

namespace {

using gcomp::Status;
using gcomp::python::devices;
using gcomp::python::to_seed;

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
      "100 us between polls, in a long wait up to 1 ms: for communication beside compute on the\n"
      "same cores), or \"auto\"\n"
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
  // The timeline's raw calls (gcomp/timeline.hpp); gcomp/timeline.py is their Python face.
  namespace tl = gcomp::timeline;
  m.def("_timeline_open", [](std::string_view file, int rank) { tl::open(file, rank); },
        py::arg("file"), py::arg("rank"));
  m.def("_timeline_close", [] {
    py::gil_scoped_release nogil;
    tl::close();
  });
  m.def("_timeline_on", &tl::on);
  m.def("_timeline_pause", &tl::pause);
  m.def("_timeline_resume", &tl::resume);
  m.def("_timeline_path", &tl::path);
  m.def("_timeline_now", &tl::now);
  m.def("_timeline_events", &tl::events);
  m.def("_timeline_span",
        [](std::string_view name, std::string_view category, double start, double end,
           std::string_view args) { tl::span(name, category, start, end, args); },
        py::arg("name"), py::arg("category"), py::arg("start"), py::arg("end"),
        py::arg("args") = "");
  m.def("_timeline_async",
        [](std::string_view phase, std::string_view name, std::string_view category,
           std::uint64_t id, double t, std::string_view args) {
          if (phase.size() != 1) throw gcomp::Error(gcomp::Status::invalid_argument,
                                                    "timeline: an async event's phase is b or e");
          tl::async(phase[0], name, category, id, t, args);
        },
        py::arg("phase"), py::arg("name"), py::arg("category"), py::arg("id"), py::arg("t"),
        py::arg("args") = "");
  m.def("_timeline_thread_name", [](std::string_view name) { tl::thread_name(name); });
  m.def(
      "wait_policy",
      [] { return std::string(gcomp::wait_policy_name(gcomp::effective_wait_policy())); },
      "wait_policy() -> str\n\nWhat waits do now: \"spin\", \"yield\" or \"sleep\" (see "
      "set_wait_policy).");

  gcomp::python::bind_codecs(m);
  gcomp::python::bind_feedback(m);
  gcomp::python::bind_adam(m);
  gcomp::python::bind_communicator(m);
}
