// The library's threading: a process-wide thread count (gcomp::set_num_threads, default from
// GCOMP_NUM_THREADS, else 1) and parallel_for over independent chunks, on OpenMP when the build
// has it. An exception thrown by a chunk is carried out of the parallel region and rethrown.
// Also the codecs' thread-local scratch vectors, so the hot paths do not allocate once warm.
#pragma once

#include <cstddef>
#include <exception>
#include <mutex>
#include <vector>

#include "gcomp/codec.hpp"

namespace gcomp::detail {

// Throws Error(invalid_argument) when an environment variable gcomp reads is malformed
// (GCOMP_NUM_THREADS). Called where a user first meets the library: building a codec, decoding.
void check_environment();

// Threads to use for `elements` of work: at most num_threads(), and at least 256K elements each.
int threads_for(std::size_t elements) noexcept;

template <class F>
void parallel_for(std::size_t count, int threads, F&& f) {
  if (threads <= 1 || count <= 1) {
    for (std::size_t i = 0; i < count; ++i) f(i);
    return;
  }
  std::exception_ptr error;
  std::mutex mu;
#if defined(_OPENMP)
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
  for (std::size_t i = 0; i < count; ++i) {
    try {
      f(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

// A thread-local vector for a codec's scratch use, named by Tag (a type declared beside its use,
// `struct SelectSample;` ... `scratch_vector<std::uint32_t, SelectSample>()`): each name is one
// vector per thread, kept at the capacity its largest use needed. Codecs keep their scratch per
// thread because a codec is a value any thread may use; the collectives' scratch is the
// Communicator's workspace (collectives/algorithms/workspace.hpp).
template <class T, class Tag>
std::vector<T>& scratch_vector() {
  thread_local std::vector<T> v;
  return v;
}

}  // namespace gcomp::detail
