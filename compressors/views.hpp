// One check shared by the calls that take TensorViews (codec.cpp, payload.cpp).
#pragma once

#include <string>

#include "device_backend.hpp"
#include "gcomp/codec.hpp"
#include "gcomp/error.hpp"

namespace gcomp::detail {

// The backend and stream of a call whose views must all be in one memory; nullptr for host.
template <class... V>
const detail::DeviceBackend* one_place(const char* what, const V&... views) {
  const detail::DeviceBackend* backend = nullptr;
  void* stream = nullptr;
  bool first = true;
  bool mixed = false;
  bool streams = false;
  auto visit = [&](const auto& v) {
    if (first) {
      backend = v.backend();
      stream = v.stream();
      first = false;
      return;
    }
    if (v.backend() != backend) mixed = true;
    if (v.stream() != stream) streams = true;
  };
  (visit(views), ...);
  if (mixed) {
    throw Error(Status::invalid_argument,
                std::string(what) +
                    ": the views are in different memories (host and device); "
                    "copy them to one side first");
  }
  if (streams) {
    throw Error(Status::invalid_argument,
                std::string(what) + ": the device views name different CUDA streams");
  }
  return backend;
}

}  // namespace gcomp::detail
