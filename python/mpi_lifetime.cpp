// MPI's lifetime as the module sees it: initialized by the first Communicator on MPI unless the
// program did it (then finalized at interpreter exit, after every Communicator still open is
// closed), and the serialization of MPI calls below MPI_THREAD_MULTIPLE.
#include <mpi.h>

#include <mutex>
#include <set>

#include "binding.hpp"

namespace gcomp::python {

namespace {

// All of it is touched with the GIL held.
struct Mpi {
  bool we_initialized = false;
  int provided = MPI_THREAD_SINGLE;
  std::mutex serial;  // below MPI_THREAD_MULTIPLE: one MPI call at a time in this process
  std::set<ClosedAtExit*> live;
};
Mpi& mpi() {
  static Mpi* m = new Mpi;  // never destroyed: it outlives every Communicator
  return *m;
}

void finalize_at_exit() {
  for (ClosedAtExit* c : std::set<ClosedAtExit*>(mpi().live)) c->close();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (mpi().we_initialized && !finalized) {
    py::gil_scoped_release nogil;
    MPI_Finalize();
  }
}

}  // namespace

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

void close_at_exit(ClosedAtExit* c) { mpi().live.insert(c); }
void forget_at_exit(ClosedAtExit* c) { mpi().live.erase(c); }

Serial::Serial() {
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

}  // namespace gcomp::python
