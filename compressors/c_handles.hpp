// The structs behind the C API's opaque handles, shared by gcomp_core's and gcomp_mpi's C layers.
#pragma once

#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "gcomp/codec.hpp"
#include "gcomp/error.hpp"
#include "gcomp/gcomp.h"

struct gcomp_codec_s {
  gcomp::Codec codec;
};
struct gcomp_ef_s {
  gcomp::ErrorFeedback ef;
};

namespace gcomp::detail {
// Records this thread's message for gcomp_last_error() and returns s.
gcomp_status set_last_error(gcomp_status s, std::string message);

// The one error guard of both C layers: runs f and maps what it throws onto a status and this
// thread's message (gcomp::Error keeps its status; anything else is GCOMP_ERR_INTERNAL); `call`
// (when given) names the C function in front of the message. f returns nothing (GCOMP_OK) or a
// status.
template <class F>
gcomp_status guarded(F&& f, const char* call = nullptr) {
  const std::string prefix = call ? std::string(call) + ": " : std::string();
  try {
    if constexpr (std::is_void_v<std::invoke_result_t<F&>>) {
      f();
      return GCOMP_OK;
    } else {
      return f();
    }
  } catch (const gcomp::Error& e) {
    return set_last_error(static_cast<gcomp_status>(e.code()), prefix + e.what());
  } catch (const std::bad_alloc&) {
    return set_last_error(GCOMP_ERR_INTERNAL, prefix + "out of memory");
  } catch (const std::exception& e) {
    return set_last_error(GCOMP_ERR_INTERNAL, prefix + e.what());
  } catch (...) {
    return set_last_error(GCOMP_ERR_INTERNAL, prefix + "unknown error");
  }
}
}  // namespace gcomp::detail
