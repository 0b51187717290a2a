// The binding's own declarations, shared by its files (python/): each file binds one subject of
// gcomp's API (codecs.cpp, feedback.cpp, communicator.cpp; MPI's lifetime in mpi_lifetime.cpp), and
// PYBIND11_MODULE (module.cpp) calls their bind_ functions in turn.
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <cstddef>
#include <mutex>
#include <string>

#include "arrays.hpp"
#include "device.hpp"
#include "gcomp/codec.hpp"

namespace gcomp::python {

// ---- error feedback (feedback.cpp) ----

// gcomp::ErrorFeedback, marked busy while a call uses it with the GIL released, so that two
// threads never run with one residual. Its memory is the host's (device -1) or a CUDA device's.
struct PyErrorFeedback {
  explicit PyErrorFeedback(std::size_t n) : ef(n) {}
  PyErrorFeedback(std::size_t n, int dev) : ef(n, devices().backend(), nullptr), device(dev) {}
  gcomp::ErrorFeedback ef;
  int device = -1;
  std::atomic<bool> busy{false};
};

// Marks an ErrorFeedback busy for one call (null: nothing); Error(invalid_argument) when it is.
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

// The error-feedback memory of a tensor: None (no error feedback) or a gcomp.ErrorFeedback of the
// tensor's size and memory (host, or its device); TypeError / ValueError naming `what` otherwise.
PyErrorFeedback* to_ef(py::handle ef, const Held& tensor, const std::string& what);
void bind_feedback(py::module_& m);

// ---- the codecs (codecs.cpp): Codec, decode_add, inspect, codecs(), DGC's momentum helpers ----

void bind_codecs(py::module_& m);

// ---- Adam and 1-bit Adam's halves (adam.cpp) ----

void bind_adam(py::module_& m);

// ---- MPI's lifetime (mpi_lifetime.cpp) ----

// What must be closed before the module finalizes MPI at interpreter exit (a Communicator).
class ClosedAtExit {
 public:
  virtual void close() = 0;

 protected:
  ~ClosedAtExit() = default;
};
// Initializes MPI (asking for MPI_THREAD_MULTIPLE) unless it is; when it did, finalizes it at
// interpreter exit, after closing every object still registered. Error(mpi) once MPI was
// finalized. With the GIL held, as every function here.
void ensure_mpi();
void close_at_exit(ClosedAtExit* c);
void forget_at_exit(ClosedAtExit* c);

// Below MPI_THREAD_MULTIPLE, one MPI call at a time in this process (and below
// MPI_THREAD_SERIALIZED, only from the main thread). Taken with the GIL released.
class Serial {
 public:
  Serial();

 private:
  std::unique_lock<std::mutex> lock_;
};

// ---- the Communicator (communicator.cpp): Communicator, TotalStats ----

void bind_communicator(py::module_& m);

}  // namespace gcomp::python
