// Splitting a tensor into chunks that threads process independently.
#pragma once

#include <algorithm>
#include <cstddef>

#include "parallel.hpp"
#include "wire.hpp"

namespace gcomp::detail {

// Calls f(begin, end) for consecutive chunks of `chunk` elements (the last may be shorter),
// on up to threads_for(n) threads.
template <class F>
void for_chunks(std::size_t n, std::size_t chunk, F&& f) {
  const std::size_t count = static_cast<std::size_t>(ceil_div(n, chunk));
  parallel_for(count, threads_for(n), [&](std::size_t c) {
    const std::size_t b = c * chunk;
    f(b, std::min(n, b + chunk));
  });
}

}  // namespace gcomp::detail
