// The structs behind the C API's opaque handles, shared by gcomp_core's and gcomp_mpi's C layers.
#pragma once

#include "gcomp/codec.hpp"
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
}  // namespace gcomp::detail
